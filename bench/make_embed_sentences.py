#!/usr/bin/env python3
"""bench/make_embed_sentences.py: writes bench/data/embed_sentences.txt, the fixed set of real-ish English
sentences that the embedding benchmarks embed (tessera-embed-bench --model, bench/embed_peers.py
sentence-transformers): one sentence a line, 1024 lines, 5 to about 60 words, from templates and word
lists with a fixed seed, so every run and every peer embeds the same text.

  python3 bench/make_embed_sentences.py [--count 1024] [--out bench/data/embed_sentences.txt]
"""
import argparse
import random
from pathlib import Path

SUBJECTS = ["The committee", "A small team of engineers", "My neighbour", "The new library", "Our customer support agent",
            "The museum's director", "A local farmer", "The research group", "The city council", "Her younger brother",
            "The delivery driver", "Most students", "The software update", "A quiet old man", "The football club",
            "The airline", "Scientists at the university", "The restaurant", "This recipe", "The hotel staff"]
VERBS = ["announced", "reviewed", "postponed", "recommended", "repaired", "described", "approved", "questioned",
         "celebrated", "measured", "replaced", "organised", "explained", "tested", "criticised", "finished"]
OBJECTS = ["the annual budget", "a plan to reduce traffic", "the broken heating system", "an exhibition of early maps",
           "the results of the survey", "a faster way to sort the mail", "the rules for parking downtown",
           "a proposal for a new bike lane", "the contract with the supplier", "the schedule for next week",
           "a recipe for lemon cake", "the cause of the power outage", "the price of train tickets",
           "a study on sleep and memory", "the design of the new bridge", "the noise from the construction site"]
TAILS = ["after a long discussion", "on Tuesday morning", "despite several objections", "in front of a large crowd",
         "without much explanation", "for the third time this year", "before the deadline", "during the storm",
         "with help from volunteers", "at the end of the meeting", "in less than an hour", "to everyone's surprise"]
QUESTIONS = ["How do I reset my password if I no longer have access to my email?",
             "What is the best way to store fresh herbs in the fridge?",
             "Why does the sky look red at sunset?",
             "Can I bring a laptop in my carry-on bag?",
             "Which train goes to the airport on Sundays?",
             "How long should I boil an egg for a soft yolk?",
             "What are the side effects of taking ibuprofen every day?",
             "Is it safe to swim in the lake after heavy rain?",
             "How many vacation days do new employees get?",
             "Where can I find the receipt for my last order?"]
ADJ = ["warm", "crowded", "quiet", "expensive", "reliable", "confusing", "beautiful", "slow", "modern", "tiny"]
PLACES = ["station", "park", "office", "kitchen", "airport", "market", "hospital", "school", "beach", "garden"]
CONNECTORS = ["because", "although", "while", "so", "but", "and"]


def sentence(r: random.Random) -> str:
    kind = r.randrange(6)
    if kind == 0:
        return f"{r.choice(SUBJECTS)} {r.choice(VERBS)} {r.choice(OBJECTS)} {r.choice(TAILS)}."
    if kind == 1:
        return r.choice(QUESTIONS)
    if kind == 2:
        return (f"The {r.choice(PLACES)} was {r.choice(ADJ)} {r.choice(TAILS)}, {r.choice(CONNECTORS)} "
                f"{r.choice(SUBJECTS).lower()} {r.choice(VERBS)} {r.choice(OBJECTS)}.")
    if kind == 3:
        return f"I think the {r.choice(PLACES)} is too {r.choice(ADJ)}."
    if kind == 4:
        n = r.randrange(2, 5)
        return " ".join(f"{r.choice(SUBJECTS)} {r.choice(VERBS)} {r.choice(OBJECTS)} {r.choice(TAILS)}." for _ in range(n))
    return (f"In {r.randrange(1950, 2026)}, {r.choice(SUBJECTS).lower()} {r.choice(VERBS)} {r.choice(OBJECTS)}, "
            f"and about {r.randrange(2, 99)}% of people said the {r.choice(PLACES)} felt {r.choice(ADJ)}.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=1024)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "data" / "embed_sentences.txt"))
    args = ap.parse_args()
    r = random.Random(20261122)
    lines = [sentence(r) for _ in range(args.count)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
