"""models/token_text.h's decode against the `tokenizers` package's, on the
same ids (Note [Byte-level decoding]).

Run by tools/tinker/cookbook_test.sh (its environment has tokenizers 0.23.3
and transformers 5.24.0), with --server naming the binary under test,
token_text_decode, and --make-tokenizer make_tokenizer.py:

  a byte-level BPE is trained into a folder (make_tokenizer.py, vocabulary
  600 with 3 special tokens); 2000 random id sequences (lengths 0-12, every
  id of the vocabulary possible: special tokens, partial UTF-8 bytes, whole
  words), plus every single id, are decoded by both, with
  skip_special_tokens true and false; every text must be equal, byte for
  byte. Bitwise, not tolerance-based: both are exact.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)  # token_text_decode
    ap.add_argument("--make-tokenizer", required=True)
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="zerostep-token-text-")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"vocab_size": 600, "max_position_embeddings": 64}, f)
    subprocess.run([sys.executable, os.path.abspath(args.make_tokenizer), folder], check=True)
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    n = tok.get_vocab_size()
    rng = random.Random(40)
    cases = [[i] for i in range(n)]
    cases += [[rng.randrange(n) for _ in range(rng.randrange(13))] for _ in range(2000)]
    got = subprocess.run([os.path.abspath(args.server), folder], check=True,
                         input="\n".join(" ".join(map(str, c)) for c in cases) + "\n",
                         capture_output=True, text=True).stdout.splitlines()
    assert len(got) == len(cases), (len(got), len(cases))
    bad = 0
    for ids, line in zip(cases, got):
        mine = [bytes.fromhex(h).decode("utf-8") for h in line.split("\t")]
        theirs = [tok.decode(ids, skip_special_tokens=True),
                  tok.decode(ids, skip_special_tokens=False)]
        if mine != theirs:
            bad += 1
            if bad <= 5:
                print("differs on", ids, mine, theirs)
    print("token_text: %d id sequences (vocabulary %d), %d differ" % (len(cases), n, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
