#!/usr/bin/python3
"""Writes tests/fixtures/tokenizer/corpus.json: >= 2,000 strings on which clrt's tokenizer must
give exactly the ids of Hugging Face tokenizers' JS port (tests/lua/test_tokenizer_parity.lua).
Deterministic (fixed seed). Covers prose, code, numbers of every length, whitespace runs, CJK,
Arabic and other scripts, emoji with joiners, combining marks (NFC), special-token strings
inside text and control characters.

Two characters are left out on purpose: U+0085 (NEL) and U+FEFF. Hugging Face compiles the
split regex with Oniguruma, whose \\s includes U+0085 and not U+FEFF; the JS port uses
JavaScript's \\s, which is the other way round. clrt follows Oniguruma (the Python/Rust
library that trains and serves the models), so on those two the JS port is not a reference.
Usage: /usr/bin/python3 tests/reference/make_tokenizer_corpus.py
"""
import json, os, random

rng = random.Random(20261122)
out = []

WORDS = ("the of and to in is you that it he was for on are as with his they I at be this have from "
         "or one had by word but not what all were we when your can said there use an each which she do "
         "how their if will up other about out many then them these so some her would make like him into "
         "time has look two more write go see number no way could people my than first water been call who "
         "oil its now find long down day did get come made may part tokenizer merges vocabulary Transformer "
         "collaborative reward conversation Hugging Face Qwen Llama gradient checkpoint").split()
PUNCT = [".", ",", "!", "?", ";", ":", "...", " -", " —", "'", '"', "(", ")", "[", "]"]
CONTR = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "'Ll", "'rE", "’s", "’ll"]

def sentence(n=None):
    n = n or rng.randint(3, 25)
    w = []
    for i in range(n):
        x = rng.choice(WORDS)
        r = rng.random()
        if r < 0.1: x = x.capitalize()
        elif r < 0.13: x = x.upper()
        if rng.random() < 0.08: x += rng.choice(CONTR)
        w.append(x)
        if rng.random() < 0.12: w[-1] += rng.choice(PUNCT)
    return " ".join(w) + rng.choice([".", "!", "?", "", "\n", ".\n\n"])

for _ in range(350):
    out.append(" ".join(sentence() for _ in range(rng.randint(1, 4))))

CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "local t = {1, 2, 3}\nfor i, v in ipairs(t) do print(i, v) end\n",
    "const x = await fetch(`${url}/api?q=${encodeURIComponent(q)}`);",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<div class=\"a\"><span>x &amp; y</span></div>",
    "    if (err != nil) {\n        return nil, fmt.Errorf(\"bad: %w\", err)\n    }\n",
    "x+=1;y-=2;z*=3;w/=4;a%=5;b**=6;c//=7;d<<=8;e>>=9;f&=g|h^~i",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "    \n\t\t  \r\n  x = [i**2 for i in range(10) if i % 2 == 0]  # squares\n",
    "fn main() -> Result<(), Box<dyn Error>> { let v: Vec<u8> = vec![0xFF; 16]; Ok(()) }",
    "$ ls -la /usr/local/bin && echo \"done\" || exit 1",
    "a:=b::c;;d..e...f->g=>h<=i>=j!=k==l===m!==n",
]
for _ in range(220):
    parts = rng.sample(CODE, rng.randint(1, 3))
    s = "".join(parts)
    if rng.random() < 0.3: s = s.replace("    ", "\t")
    if rng.random() < 0.2: s = s.replace("\n", "\r\n")
    out.append(s)

# numbers of every length, alone and in text
for L in range(1, 61):
    for _ in range(3):
        d = "".join(rng.choice("0123456789") for _ in range(L))
        out.append(rng.choice(["{}", " {}", "x{}y", "{} apples", "v{}.{}", "-{}", "{},{}", "${}", "{}%", "{}e-5"]).format(d, d[::-1]))
for _ in range(60):
    out.append(f"{rng.randint(0, 10**rng.randint(1, 18)):,}" + " " + str(rng.random() * 10 ** rng.randint(-5, 12)))
out += ["٣٤٥ ١٢", "१२३४", "１２３４５", "Ⅻ ⅷ", "½ ¾ ² ³", "𝟘𝟙𝟚", "0x1F600 0b1010 0o777"]

# whitespace runs
WS = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u2029", "\u2003", "\u200b", "\x0b", "\x0c"]
for _ in range(220):
    s = ""
    for _ in range(rng.randint(1, 6)):
        s += "".join(rng.choice(WS) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.6: s += rng.choice(WORDS)
        if rng.random() < 0.2: s += rng.choice(PUNCT)
    out.append(s)
for k in range(1, 40):
    out.append(" " * k)
    out.append("a" + " " * k + "b")
    out.append("\n" * k)
    out.append("x" + "\t" * k)
    out.append(" " * k + "\n" + " " * k + "y")

# scripts
SCRIPTS = [
    "你好，世界！今天天气很好。我们一起去公园散步吧。", "机器学习模型的训练需要大量的数据和计算资源。",
    "日本語のテキストも正しく処理されるべきです。カタカナとひらがな。", "東京都渋谷区神南一丁目",
    "안녕하세요. 한국어 문장입니다. 토크나이저 테스트.", "مرحبا بالعالم. هذا نص عربي للاختبار.",
    "שלום עולם, זה טקסט בעברית.", "Привет, мир! Это тест токенизатора.", "Γειά σου Κόσμε! Ελληνικά.",
    "नमस्ते दुनिया। यह हिंदी है।", "สวัสดีชาวโลก นี่คือภาษาไทย", "Xin chào thế giới. Tiếng Việt có dấu.",
    "Ça va? Où est la bibliothèque? Straße, Größe, Œuvre.", "ሰላም ለዓለም", "Բարեւ աշխարհ", "გამარჯობა მსოფლიო",
    "ⲁⲛⲟⲕ", "ꦲꦏ꧀ꦱꦫ", "𐌰𐌱𐌲", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕸𝖆𝖙𝖍", "ℌ𝔢𝔩𝔩𝔬 ℓ ℮", "ﬁﬂ ﬃ", "ｆｕｌｌ ｗｉｄｔｈ",
]
for _ in range(300):
    k = rng.randint(1, 3)
    s = rng.choice([" ", "", "\n", " - "]).join(rng.choice(SCRIPTS) for _ in range(k))
    if rng.random() < 0.4:
        i = rng.randint(0, len(s))
        s = s[:i] + rng.choice([" ", sentence(3), "123", "\n"]) + s[i:]
    if rng.random() < 0.3:
        a = rng.randint(0, len(s)); b = rng.randint(a, len(s)); s = s[a:b] or s
    out.append(s)

# emoji: joiners, skin tones, flags, keycaps, variation selectors
EMOJI = ["👨‍👩‍👧‍👦", "👩🏽‍💻", "🧑🏿‍🤝‍🧑🏻", "🏳️‍🌈", "🇯🇵", "🇺🇸🇫🇷", "1️⃣", "#️⃣", "❤️", "❤︎", "👍🏻", "🤷‍♀️",
         "😀", "🎉", "🚀", "🐍", "🦀", "⭐", "☕", "🇦", "‍", "️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
for _ in range(200):
    s = ""
    for _ in range(rng.randint(1, 8)):
        s += rng.choice(EMOJI)
        if rng.random() < 0.4: s += rng.choice([" ", "", rng.choice(WORDS), "!", "\n"])
    out.append(s)

# combining marks and decomposed forms (NFC must compose them where the normalizer asks)
BASES = "aeiouAEIOUnNcCsSzZyY가각ᄀ"
MARKS = ["\u0301", "\u0300", "\u0308", "\u0302", "\u0303", "\u0327", "\u030c", "\u0323", "\u0331", "\u20dd", "\u0345", "\u05b7", "\u093c"]
for _ in range(200):
    s = ""
    for _ in range(rng.randint(1, 10)):
        s += rng.choice(BASES) + "".join(rng.choice(MARKS) for _ in range(rng.randint(0, 3)))
        if rng.random() < 0.3: s += " "
    out.append(s)
out += ["e\u0301", "\u1100\u1161\u11a8", "\u1100\u1161", "Å Å Å", "ﬀ", "Ω Ω", "\u0344", "q\u0307\u0323",
        "\u00e9\u0301", "a\u0328\u0301", "\u0958", "\u2126", "\u212b"]

# special-token strings inside text (and near misses)
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
           "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|end_of_text|>",
           "<|reserved_special_token_5|>", "<|im_start", "im_end|>", "<|", "|>", "< |im_end| >", "<|IM_END|>"]
for _ in range(220):
    s = ""
    for _ in range(rng.randint(1, 6)):
        s += rng.choice(SPECIAL)
        s += rng.choice(["", " ", "\n", "user\n", "assistant", sentence(4), "  ", "\t"])
    out.append(s)

# control characters (C0, DEL, C1 except U+0085)
CTRL = [chr(c) for c in list(range(0, 32)) + [127] + [c for c in range(0x80, 0xA0) if c != 0x85]]
for _ in range(150):
    s = ""
    for _ in range(rng.randint(1, 10)):
        s += rng.choice(CTRL) * rng.randint(1, 3)
        if rng.random() < 0.5: s += rng.choice(WORDS + [" ", "\n", "123", "!!"])
    out.append(s)

# random mixtures of code points from many blocks
RANGES = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x5ff), (0x600, 0x6ff),
          (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x2190, 0x23ff), (0x2500, 0x27bf),
          (0x3000, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0xff00, 0xffef), (0x1f300, 0x1f64f), (0x1f900, 0x1f9ff)]
for _ in range(250):
    s = ""
    for _ in range(rng.randint(1, 30)):
        a, b = rng.choice(RANGES)
        c = rng.randint(a, b)
        if c in (0x85, 0xfeff) or 0xd800 <= c <= 0xdfff: continue
        s += chr(c)
    out.append(s)

# a few long documents
for _ in range(12):
    out.append("\n\n".join(rng.choice([sentence(40), rng.choice(CODE), rng.choice(SCRIPTS) * 3, "".join(rng.sample(EMOJI, 5))])
                           for _ in range(30)))

out += ["", " ", "a", "'", "'s", "''s", "x's", "I'M", "don’t", "A'LL'D", " 's", "\n's", "é's", "1's",
        "Hello", " Hello", "  Hello", "Hello ", "Hello  ", "\u00a0Hello", "Hello\u00a0\u00a0world"]

assert len(out) >= 2000, len(out)
assert not any("\u0085" in s or "\ufeff" in s for s in out)
here = os.path.dirname(os.path.abspath(__file__))
path = os.path.join(here, "..", "fixtures", "tokenizer", "corpus.json")
with open(path, "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False, indent=0)
print(f"wrote {len(out)} strings, {sum(len(s.encode()) for s in out)} bytes to {os.path.normpath(path)}")
