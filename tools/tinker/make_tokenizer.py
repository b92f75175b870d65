"""Trains a small byte-level BPE with the `tokenizers` package and saves it
into a Hugging Face folder (make_hf_model's random weights), so the folder
is what a real model's is: config.json, model.safetensors, tokenizer.json
and tokenizer_config.json that transformers' AutoTokenizer loads from the
path, with no network.

    python make_tokenizer.py DIR [--vocab=N]

The tokenizer: GPT-2's byte-level pre-tokenizer and decoder (as Llama 3's
and Qwen's), trained on TEXT below to `--vocab` ids (default: the folder's
config.json vocab_size), with the special tokens <|endoftext|> (the EOS,
written into config.json as eos_token_id), <|im_start|> and <|im_end|>.
Deterministic: the same folder for the same arguments. Needs tokenizers and
transformers (pinned by the caller's requirements file).
"""

import argparse
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Plain English and the shapes the tests' conversations take (roles,
# arithmetic, short answers), with every printable ASCII byte.
TEXT = [
    "User: hi\n\nAssistant: hello\n\n",
    "User: 2+2\n\nAssistant: 4\n\n",
    "User: what colour is the sky?\n\nAssistant: The sky is blue.\n\n",
    "User: cat\n\nAssistant: meow\n\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "A model reads tokens and predicts the next one; training lowers the loss.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 100 1000 3.14 -7",
    "".join(chr(c) for c in range(32, 127)),
    "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c \U0001F600",
]


def train(vocab):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=1,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXT * 20, trainer=trainer)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--vocab", type=int, default=0)
    args = ap.parse_args()
    config_path = os.path.join(args.dir, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    vocab = args.vocab or config["vocab_size"]
    if vocab > config["vocab_size"]:
        raise SystemExit(
            "make_tokenizer: --vocab=%d exceeds the model's vocab_size %d"
            % (vocab, config["vocab_size"]))
    tok = train(vocab)
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=config["max_position_embeddings"],
    )
    fast.save_pretrained(args.dir)
    config["eos_token_id"] = tok.token_to_id("<|endoftext|>")
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    print("make_tokenizer: %d ids (%d trained), eos %d, in %s"
          % (tok.get_vocab_size(), vocab, config["eos_token_id"], args.dir))


if __name__ == "__main__":
    main()
