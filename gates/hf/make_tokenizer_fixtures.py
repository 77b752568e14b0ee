#!/usr/bin/env python3
"""HF `tokenizers` parity fixtures for text/ (issue 14), and HF's encode throughput.

Builds a deterministic corpus (seeded, no input data): several scripts and languages, emoji
(ZWJ sequences, flags, skin tones), code, HTML whose tags are Gemma added tokens, runs of
spaces / tabs / newlines, special tokens inside text, random code points (byte fallback),
and the empty string. Encodes every string with the canonical implementation and writes

  {"tokenizers_version", "tokenizer_sha256", "corpus_sha256",
   "encode": [[text, [ids]], ...],                 # add_special_tokens=False
   "encode_bos": [[text, [ids]], ...],             # add_special_tokens=True (post-processor)
   "decode": [[[ids], text, text_skip_special], ...]}  # random id sequences

as compact JSON (--out). With --bench-out it also times HF encode on the same corpus, one
thread (TOKENIZERS_PARALLELISM=false; a plain loop of encode() and one encode_batch()), cold
(fresh tokenizer, empty word cache) and warm (best of several passes), plus one ~32k-token
prompt, and writes the figures as JSON.

Run on the GPU runner (it has `tokenizers`):
  python3 gates/hf/make_tokenizer_fixtures.py --tokenizer DIR/tokenizer.json \
      --out fixture.json --bench-out hf_bench.json
The corpus alone (no `tokenizers` needed): --corpus-only FILE writes the strings as JSON.
"""

import argparse
import hashlib
import json
import os
import random
import sys
import time

SEED = 20261201
CORPUS_SIZE = 2400

LANG = [
    "The quick brown fox jumps over the lazy dog.",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "Größenwahn ist keine Lösung; Straße, Fuß, Maß und Äpfel.",
    "¿Dónde está la biblioteca? ¡Mañana será otro día!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر",
    "דג סקרן שט בים מאוכזב ולפתע מצא חברה",
    "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले",
    "আমি বাংলায় গান গাই, আমি বাংলার গান গাই",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
    "我能吞下玻璃而不伤身体。天地玄黄，宇宙洪荒。",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ。東京都庁",
    "다람쥐 헌 쳇바퀴에 타고파. 키스의 고유조건은 입술끼리 만나야 하고",
    "Tiếng Việt có dấu: Những con cò bay lả bay la.",
    "Pijamalı hasta yağız şoföre çabucak güvendi.",
    "Zażółć gęślą jaźń. Pchnąć w tę łódź jeża lub ośm skrzyń fig.",
    "Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!",
    "ქართული ენა უძველესი ენაა",
    "Հայերեն լեզուն հնդեվրոպական լեզու է",
    "ሰማይ አይታረስ ንጉሥ አይከሰስ",
    "யாமறிந்த மொழிகளிலே தமிழ்மொழி போல் இனிதாவது எங்கும் காணோம்",
    "Þú ert úti að aka á ísköldum vegi.",
    "Kæmi ný öxi hér, ykist þjófum nú bæði víl og ádrepa.",
    "ᚠᛇᚻ᛫ᛒᛦᚦ᛫ᚠᚱᚩᚠᚢᚱ᛫ᚠᛁᚱᚪ᛫ᚷᛖᚻᚹᛦᛚᚳᚢᛗ",
    "𐌰𐌱𐌲𐌳 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 𠜎𠜱𠝹𠱓",
    "ཨོཾ་མ་ཎི་པདྨེ་ཧཱུྃ",
    "မြန်မာဘာသာ",
    "ភាសាខ្មែរ",
    "ᐃᓄᒃᑎᑐᑦ",
]
EMOJI = [
    "😀", "😂", "🥹", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "❤️", "1️⃣", "🧑🏿‍💻",
    "🫠", "🪿", "✨", "🔥", "👩🏻‍🔬", "🤌", "☕", "🐍", "🦀",
]
CODE = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v[0];\n}\n",
    '{"key": [1, 2.5e-3, null, true], "nested": {"a": "b\\n"}}',
    "<html><body><div class=\"x\"><table><tr><td>1</td></tr></table></div></body></html>",
    "for i in $(seq 1 10); do echo \"$i\" >> /tmp/out.txt; done",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "fn main() { let x: Vec<u8> = b\"hi\".to_vec(); println!(\"{:?}\", x); }",
    "const f = async (a) => { await fetch(`/api/${a}`); };",
    "^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@[a-z]+\\.[a-z]{2,}$",
    "    if (x) {\n        y();\n    }\r\n",
    "<strong>bold</strong> <em>it</em> <code>x</code> <sub>2</sub> <h1>T</h1> <s>",
    "x = [[1,2],[3,4]]  # matrix\n\n\n\n# comment\t\ttabs",
]
SPECIAL = [
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
    "<start_of_image>", "<end_of_image>", "<image_soft_token>", "<unused0>", "<unused99>",
    "<unused6241>", "[multimodal]", "<start_of_tur", "<<bos>>", "</s>", "<bos", "eos>",
    "<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n",
]
SPACES = [" ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n",
          "\r\n", "\r", " \n ", "\u00a0", "\u3000", "\u2009", "\u200b", "\u2581", "\u2581\u2581",
          "\f", "\v", " " * 40, "\n" * 35, "\t" * 33]
WORDS = ("time person year way day thing man world life hand part child eye woman place work "
         "week case point government company number group problem fact be have do say get "
         "make go know take see come think look want give use find tell ask seem feel try "
         "leave call good new first last long great little own other old right big high "
         "different small large next early young important few public bad same able").split()
RANGES = [(0x20, 0x7e), (0xa0, 0x17f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
          (0x900, 0x97f), (0xe00, 0xe7f), (0x3040, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3),
          (0x1f300, 0x1faff), (0x20000, 0x2a6df), (0xe000, 0xf8ff), (0x0, 0x1f),
          (0x300, 0x36f), (0x10000, 0x1ffff), (0xf0000, 0xffffd), (0x2000, 0x206f)]


def random_codepoints(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(RANGES)
        c = rng.randint(lo, hi)
        if 0xD800 <= c <= 0xDFFF:
            c = 0x41
        out.append(chr(c))
    return "".join(out)


def sentence(rng):
    n = rng.randint(1, 18)
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.3:
        words[0] = words[0].capitalize()
    s = " ".join(words)
    return s + rng.choice([".", "!", "?", ",", "", "...", ";"])


def piece(rng):
    kind = rng.randrange(8)
    if kind == 0:
        return sentence(rng)
    if kind == 1:
        return rng.choice(LANG)
    if kind == 2:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
    if kind == 3:
        return rng.choice(CODE)
    if kind == 4:
        return rng.choice(SPECIAL)
    if kind == 5:
        return rng.choice(SPACES)
    if kind == 6:
        return random_codepoints(rng, rng.randint(1, 12))
    return str(rng.randint(0, 10**rng.randint(1, 12))) + rng.choice(["", "%", " km", ".5", "e9"])


def mixture(rng):
    parts = [piece(rng) for _ in range(rng.randint(1, 8))]
    glue = rng.choice(["", " ", "\n", "  ", "\t"])
    return glue.join(parts)


def build_corpus():
    rng = random.Random(SEED)
    corpus = ["", " ", "\n", "a", "\u2581", "<bos>", "Hello world", " Hello world ",
              "Hello\nworld", "\n\n\n", " " * 100, "\n" * 100]
    corpus += LANG + EMOJI + CODE + SPECIAL + SPACES
    corpus += [s + " " + s for s in LANG]
    corpus += [" " + s for s in LANG] + [s + "\n" for s in LANG]
    # Slices of a long mixed text at random code point boundaries.
    big = "".join(mixture(rng) for _ in range(300))
    for _ in range(200):
        a = rng.randrange(len(big))
        corpus.append(big[a:a + rng.randint(1, 400)])
    # A few long documents (these dominate the byte count, as real prompts do).
    for _ in range(8):
        corpus.append("\n\n".join(mixture(rng) for _ in range(rng.randint(100, 300))))
    while len(corpus) < CORPUS_SIZE:
        corpus.append(mixture(rng))
    return corpus


def random_id_sequences(rng, vocab_size, count):
    """Id sequences for decode parity: byte-fallback runs (valid and broken UTF-8), specials,
    ordinary pieces. Byte tokens are <0x00>..<0xFF> at ids 238..493 in Gemma 3 (checked by the
    caller)."""
    seqs = []
    for _ in range(count):
        ids = []
        for _ in range(rng.randint(0, 24)):
            r = rng.random()
            if r < 0.35:
                ids.append(rng.randrange(238, 238 + 256))
            elif r < 0.45:
                ids.append(rng.choice([0, 1, 2, 3, 4, 105, 106, 255999, 256000, 262144]))
            else:
                ids.append(rng.randrange(vocab_size))
        seqs.append(ids)
    return seqs


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def time_hf(tokenizer_path, corpus, out_path):
    from tokenizers import Tokenizer
    total_bytes = sum(len(s.encode("utf-8")) for s in corpus)
    figures = {"corpus_strings": len(corpus), "corpus_bytes": total_bytes}
    tok = Tokenizer.from_file(tokenizer_path)  # fresh: empty BPE word cache
    t0 = time.perf_counter()
    for s in corpus:
        tok.encode(s, add_special_tokens=False)
    cold = time.perf_counter() - t0
    figures["loop_cold_mb_s"] = total_bytes / cold / 1e6
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for s in corpus:
            tok.encode(s, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
    figures["loop_warm_mb_s"] = total_bytes / best / 1e6
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        tok.encode_batch(corpus, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
    figures["batch_warm_mb_s"] = total_bytes / best / 1e6
    # One long prompt of about 32k tokens: the TTFT question.
    pieces, count, i = [], 0, 0
    while count < 32768:
        text = corpus[len(corpus) - 1 - (i % 64)] + "\n"
        pieces.append(text)
        count += len(tok.encode(text, add_special_tokens=False).ids)
        i += 1
    long_text = "".join(pieces)
    n = len(tok.encode(long_text, add_special_tokens=False).ids)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        tok.encode(long_text, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
    figures["long_prompt_tokens"] = n
    figures["long_prompt_bytes"] = len(long_text.encode("utf-8"))
    figures["long_prompt_ms"] = best * 1e3
    figures["threads"] = "TOKENIZERS_PARALLELISM=false, RAYON_NUM_THREADS=1"
    with open(out_path, "w") as f:
        json.dump(figures, f, indent=1)
    print("hf bench:", json.dumps(figures))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", help="tokenizer.json")
    ap.add_argument("--out", help="fixture JSON to write")
    ap.add_argument("--bench-out", help="HF throughput JSON to write")
    ap.add_argument("--corpus-only", help="write the corpus strings as JSON and stop")
    args = ap.parse_args()
    corpus = build_corpus()
    assert len(corpus) >= 2000 and "" in corpus
    corpus_sha = hashlib.sha256(json.dumps(corpus, ensure_ascii=False).encode()).hexdigest()
    if args.corpus_only:
        with open(args.corpus_only, "w", encoding="utf-8") as f:
            json.dump(corpus, f, ensure_ascii=False)
        print(f"corpus: {len(corpus)} strings, sha256 {corpus_sha}")
        return
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    import tokenizers
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(args.tokenizer)
    assert tok.token_to_id("<0x00>") == 238 and tok.token_to_id("<0xFF>") == 238 + 255
    encode = [[s, tok.encode(s, add_special_tokens=False).ids] for s in corpus]
    encode_bos = [[s, tok.encode(s).ids] for s in corpus[:50]]
    rng = random.Random(SEED + 1)
    decode = []
    for ids in random_id_sequences(rng, tok.get_vocab_size(with_added_tokens=True), 600):
        decode.append([ids, tok.decode(ids, skip_special_tokens=False),
                       tok.decode(ids, skip_special_tokens=True)])
    fixture = {
        "tokenizers_version": tokenizers.__version__,
        "tokenizer_sha256": sha256_file(args.tokenizer),
        "corpus_sha256": corpus_sha,
        "vocab_size_with_added": tok.get_vocab_size(with_added_tokens=True),
        "encode": encode,
        "encode_bos": encode_bos,
        "decode": decode,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, separators=(",", ":"))
    ids_total = sum(len(e[1]) for e in encode)
    print(f"fixture: {len(encode)} strings, {ids_total} ids, tokenizers {tokenizers.__version__}")
    if args.bench_out:
        time_hf(args.tokenizer, corpus, args.bench_out)


if __name__ == "__main__":
    sys.exit(main())
