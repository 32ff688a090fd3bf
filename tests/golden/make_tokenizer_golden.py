#!/usr/bin/env python3
# Writes the tokenizer golden files that tests/unit/test_tokenizer.cpp checks dflash_mpi's C++ BPE against:
# a byte-level BPE trained here with Hugging Face `tokenizers` under the Qwen2 settings (NFC normaliser, the
# Qwen2 split regex, ByteLevel without its own regex, Qwen's special and added tokens) over a multilingual
# sample, and the ids that library gives for test strings (CJK, emoji, code, whitespace runs, numbers,
# decomposed accents, special tokens inside text, chat-rendered turns). Run on the GPU machine (it has
# `tokenizers`): python3 tests/golden/make_tokenizer_golden.py OUT_DIR ; then commit OUT_DIR's two files into
# tests/golden/tokenizer/.
import json
import os
import sys
import unicodedata

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TRAIN = [
    "The quick brown fox jumps over the lazy dog. It's 2026 and we're training drafters!",
    "Speculative decoding drafts 16 tokens at once; the target verifies them in one forward pass.",
    "def forward(self, x):\n    return self.proj(torch.relu(x)) + 3.14159\n\n\tif x is None:\n\t\tpass\n",
    "int main() { for (int i = 0; i < 10; ++i) printf(\"%d\\n\", i); return 0; }",
    "我们在训练一个推测解码的草稿模型。今天天气很好，我们去公园散步吧！",
    "日本語のテキストも少し入れておきます。カタカナとひらがな、そして漢字。",
    "한국어 문장도 포함합니다. 안녕하세요, 반갑습니다.",
    "Emoji time 😀🎉🚀👩‍💻🇩🇪 and symbols ©®™ ∑∫√∞ ≠ ≤ ≥ → ← ↑ ↓",
    "Numbers: 1234567890 3.5e-7 0x1F 1,000,000 ٣٤٥ १२३",
    "Ünïcödé àccénts: café naïve résumé Ångström façade Œuvre straße",
    "مرحبا بالعالم، هذا نص عربي للاختبار.",
    "Привет, мир! Это русский текст для проверки токенизатора.",
    "    indented    with     runs of   spaces\n\n\n\nand newlines\r\n\r\nand tabs\t\t\tend",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nSimple.\n</think>\n\n4<|im_end|>\n",
]

TESTS = [
    "Hello world",
    "It's 2026; they'll see we've DONE it, haven't we? I'M SURE",
    "  leading spaces and trailing   ",
    "a\n\nb\r\n\r\n  \n\tc   \t  d",
    "numbers 12345 and 3.14159 and ٣٤٥٦ and ① ② and 1e10",
    "我们在训练一个推测解码的草稿模型，没见过的字：龘靐齉",
    "ひらがなカタカナ漢字 한국어 Ελληνικά עברית",
    "😀😀😀 🤖 👩‍👩‍👧‍👦 🇯🇵 ⚙️ x²",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n",
    "if (a <= b && c != d) { x->y[i] += *p++; }",
    "cafe\u0301 and cafe\u0301s: decomposed accents NFC composes",
    "Ångström vs A\u030angstro\u0308m",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "text<|im_end|>glued<|endoftext|>to<think>tokens</think>",
    "<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is 42.<|im_end|>\n",
    "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n",
    "zero-width\u200bspace and nbsp\u00a0here and ideographic\u3000space",
    "!!!??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]]",
    "x",
    " ",
    "\n",
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/tokenizer"
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=1, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [unicodedata.normalize("NFC", t) for t in TRAIN] * 3
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens(["<think>", "</think>", "<tool_response>", "</tool_response>"])
    path = os.path.join(out, "tokenizer.json")
    tok.save(path)
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in TESTS + TRAIN]
    with open(os.path.join(out, "golden.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "cases": cases}, f, ensure_ascii=False, indent=0)
    print(f"wrote {path} ({tok.get_vocab_size()} tokens) and {len(cases)} cases, tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
