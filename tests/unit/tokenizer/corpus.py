"""Deterministic tokenizer test strings: a hand-written list plus seeded random mixtures.

Shared by the parity tests and the fixture script, so every run compares the same inputs.
"""
import random

HAND_WRITTEN = [
    "Hello world!",
    "Hello, world! How are you today?",
    "I'm sure they'll say it's fine, we've seen worse, you're right, he'd agree.",
    "DON'T SHOUT. I'M HERE. IT'S OK.",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "  ",
    "   leading spaces",
    "trailing spaces   ",
    "a  b   c    d",
    "tab\tseparated\tvalues\t",
    "\t\t\tindent",
    "line one\nline two\n\nline four\n",
    "\n\n\n",
    "windows\r\nline\r\nendings",
    " \n \n ",
    "mixed \t \n \r\n whitespace",
    "1234567890",
    "3.14159265358979",
    "1,000,000 and 2.5e-10 and 0x1F",
    "Call 555-0123 or +1 (800) 555-0199.",
    "Year 2024: 12 months, 52 weeks, 365 days.",
    "١٢٣٤٥٦٧٨٩٠ Arabic-Indic digits",
    "१२३ Devanagari digits",
    "１２３ fullwidth digits",
    "x² + y³ = z½ ⅓ ⅔",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|><|endoftext|>",
    "text<|im_end|>text",
    " <|im_start|> spaced <|im_end|> ",
    "<|im_start|",
    "<|endoftext|>",
    "<repo_name>tessera<file_sep>main.cpp",
    "[CLS] a sentence [SEP] another one [SEP]",
    "[CLS][SEP][MASK][PAD][UNK]",
    "[cls] lowercase is not special",
    "A [MASK] in the middle.",
    "<s> [INST] hello [/INST] </s>",
    "café résumé naïve coöperate façade",
    "Crème brûlée à la française",
    "Ångström Øresund Æsir straße",
    "İstanbul ıi ΣΑΣ σας",
    "e\u0301 decomposed e-acute, n\u0303 decomposed n-tilde",
    "Ελληνικά: Καλημέρα κόσμε",
    "Русский текст: Привет, мир!",
    "עברית: שלום עולם",
    "العربية: مرحبا بالعالم",
    "हिन्दी: नमस्ते दुनिया",
    "ไทย: สวัสดีชาวโลก",
    "中文：你好，世界！",
    "日本語：こんにちは世界。カタカナ、ひらがな。",
    "한국어: 안녕하세요 세계",
    "汉字和English混合text",
    "emoji 😀😃😄😁 and more 🎉🎊",
    "family 👨‍👩‍👧‍👦 zwj sequence",
    "flags 🇺🇸🇫🇷🇯🇵",
    "skin tones 👍🏻👍🏽👍🏿",
    "🤗 hugging face 🥰🫠",
    "math ∑∫∂√∞ ≤ ≥ ≠ ≈ ∈ ∉",
    "arrows ← → ↑ ↓ ⇒ ⇔",
    "quotes “double” ‘single’ «guillemets» „low“",
    "dashes – — and ellipsis …",
    "zero\u200bwidth\u200cjoiner\u200dtest",
    "bom\ufeffinside",
    "soft\u00adhyphen",
    "nbsp\u00a0here and\u3000ideographic space",
    "control\x07bell\x1bescape",
    "nul\x00byte",
    "replacement \ufffd char",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "#include <vector>\nint main() { return 0; }",
    "if x != y && y >= z || !flag:",
    "SELECT * FROM users WHERE id = 42;",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
    "https://example.com/path?query=1&other=two#fragment",
    "user@example.com",
    "C:\\Program Files\\App\\bin",
    "$HOME/.cache/tessera/models",
    "a" * 120,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "x" * 101 + " short",
    "'s 't 're 've 'm 'll 'd",
    "''quoted'' and \"double\"",
    "!!!??? ... ;;; ::: ---",
    "@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "snake_case camelCase PascalCase kebab-case",
    "ALLCAPS lowercase MiXeD",
    "tokenization tokenizer tokenized tokens",
    "123abc abc123 a1b2c3",
    "Mr. Smith's 3rd car (a '99 model) cost $4,500.",
    "don't do not won't will not",
    "end.",
    "?",
    "日本",
    "\u0300 leading combining mark",
    "a\u0308\u0301 stacked marks",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝒮𝒸𝓇𝒾𝓅𝓉",
    "Ｆｕｌｌｗｉｄｔｈ ＡＳＣＩＩ",
    "ﬁ ligature ﬂ",
    "\u2028line separator\u2029paragraph separator",
    "\u0085next line",
    "\x0bvertical\x0cform feed",
    "mongolian\u180evowel separator",
    "unassigned \u0378 code point",
    "private use \ue000\uf8ff",
    "astral \U0001F600\U00020000\U0002A6D6",
]

_POOLS = [
    "abcdefghijklmnopqrstuvwxyz",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    "0123456789.,",
    " " * 6 + "\t\n",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœ",
    "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔ",
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВ",
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
    "あいうえおかきくけこさしすせそたちつてとアイウエオカキクケコ",
    "가나다라마바사아자차카타파하한국어",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह",
    "😀😂🥲😍🤔👍🙏🔥✨🎉❤️🚀🌍🍕⚽🇩🇪👩‍💻",
    "←→↑↓∑∏√∞≈≠≤≥∈∩∪∂∫",
    "\u0300\u0301\u0302\u0303\u0308\u0327",
    "\u200b\u200d\u00a0\u3000\u2009\u202f\ufeff",
    "١٢٣٤٥٦٧٨٩٠²³½",
]

_WORDS = [
    "the", "of", "and", "to", "in", "is", "tokenizer", "model", "inference", "server", "attention", "GPU",
    "Hello", "World", "don't", "it's", "we'll", "they're", "I've", "café", "naïve", "東京", "北京", "München",
    "über", "señor", "Straße", "résumé", "2024", "3.14", "v1.2.3", "#include", "std::vector<int>", "->", "=>",
    "**kwargs", "self.x", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "[CLS]", "[SEP]", "[MASK]",
    "<s>", "</s>", "[INST]", "😀", "🤗", "👨‍👩‍👧", "  ", "\n", "\t", "...", "?!", "URL", "https://x.io",
]


def random_string(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.45:
            parts.append(rng.choice(_WORDS))
        else:
            pool = rng.choice(_POOLS)
            parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 10))))
        if rng.random() < 0.6:
            parts.append(rng.choice([" ", " ", " ", "  ", "\n", "\t", "", " \n", "   "]))
    return "".join(parts)


def corpus(count: int = 2000, seed: int = 1234) -> list:
    """HAND_WRITTEN followed by seeded random strings, `count` strings in all."""
    rng = random.Random(seed)
    strings = list(HAND_WRITTEN)
    while len(strings) < count:
        strings.append(random_string(rng))
    return strings
