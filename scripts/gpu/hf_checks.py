#!/usr/bin/env python3
"""hf_checks.py — clrt against Hugging Face's own libraries, on any machine that has them
(transformers, peft, safetensors, tokenizers, tensorboard, with PyTorch); a check whose
library is missing is skipped with the reason. clrt's side runs through scripts/gpu/hf_clrt.lua.

  python3 scripts/gpu/hf_checks.py --clrt build/release/clrt [--work DIR] [--device-also cuda]
                                   [--only transformers_to_clrt,clrt_to_transformers,lora_peft,tokenizer,tensorboard]

Checks (each prints PASS/FAIL/SKIP with the figures):
  transformers_to_clrt  random Llama (GQA, untied), Qwen2 (QKV bias, tied) and Qwen3 (q/k norm)
                        models made by transformers, every weight perturbed (biases and norms
                        too), save_pretrained -> clrt.model.load: logits at every position and
                        the log-probabilities of the next tokens equal to transformers'
  clrt_to_transformers  random models made and saved by clrt -> AutoModelForCausalLM: same logits
  lora_peft             LoRA adapters trained by clrt (3 AdamW steps, so B != 0), saved as
                        PEFT's folder -> PeftModel: logits, and merge_and_unload()'s logits
  tokenizer             a byte-level BPE trained by clrt on the tokenizer corpus and written as
                        tokenizer.json -> tokenizers.Tokenizer: the same ids on every text
  tensorboard           an event file written by clrt -> tensorboard's EventAccumulator: every
                        scalar (as float32) and the text sample
--device-also cuda repeats clrt's logits on the GPU against the same references.
Exit 0 when nothing failed (77 when every check was skipped), 1 when a check failed.
"""
import argparse
import importlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HELPER = os.path.join(HERE, "hf_clrt.lua")
results = []


def report(name, status, detail):
    results.append((name, status))
    print(f"{status} {name}: {detail}", flush=True)


def missing(*modules):
    """The first module that does not import, or None."""
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # an ImportError, or a broken install
            return f"{m} not importable ({type(e).__name__}: {e})"
    return None


class Clrt:
    def __init__(self, binary, work):
        self.binary, self.work = binary, work

    def __call__(self, *args, timeout=300):
        env = dict(os.environ, CLRT_SOURCE_DIR=ROOT)
        p = subprocess.run([self.binary, HELPER, *map(str, args)], capture_output=True, text=True,
                           timeout=timeout, env=env, cwd=ROOT)
        if p.returncode != 0:
            raise RuntimeError(f"clrt hf_clrt.lua {args[0]} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
        return p.stdout

    def logits(self, model_dir, tokens, device="cpu", adapter=""):
        tok_file = os.path.join(self.work, "tokens.json")
        with open(tok_file, "w") as f:
            json.dump(tokens, f)
        out = os.path.join(self.work, "logits.json")
        self("logits", model_dir, tok_file, out, device, adapter)
        with open(out) as f:
            return json.load(f)


def compare_logits(name, got, ref_logits, tokens, rtol, ref_prefix_logits=None):
    """got: clrt's {"logits", "logprobs"}; ref_logits: torch [T, V] of one forward over the
    tokens (what clrt's logprobs is compared with). clrt's logits come from a prefill of each
    prefix: ref_prefix_logits [T, V] (row t from a forward over tokens[:t + 1]) where the
    frequencies depend on the call's length (longrope, dynamic), else ref_logits. Max
    difference over the largest reference logit; the next tokens' log-probabilities likewise."""
    import torch
    g = torch.tensor(got["logits"], dtype=torch.float64)
    r = (ref_prefix_logits if ref_prefix_logits is not None else ref_logits).to(torch.float64)
    if g.shape != r.shape:
        return False, f"logits shape {tuple(g.shape)} against {tuple(r.shape)}"
    scale = max(r.abs().max().item(), 1e-6)
    err = (g - r).abs().max().item() / scale
    full = ref_logits.to(torch.float64)
    ref_lp = torch.log_softmax(full, -1)[:-1].gather(1, torch.tensor(tokens[1:]).unsqueeze(1)).squeeze(1)
    glp = torch.tensor(got["logprobs"], dtype=torch.float64)
    lp_err = (glp - ref_lp).abs().max().item() / max(ref_lp.abs().max().item(), 1e-6)
    ok = math.isfinite(err) and math.isfinite(lp_err) and err <= rtol and lp_err <= rtol
    return ok, (f"{got.get('device', 'cpu')}: logits max diff {err:.2e} of scale {scale:.3g}, "
                f"next-token log-probs {lp_err:.2e} (tolerance {rtol:g})")


ARCHS = {
    # name: (transformers config class, its arguments): small, GQA, a rope_theta that is not
    # the 10000 a reader would fall back to, so a lost setting shows in the logits
    "llama": ("LlamaConfig", dict(vocab_size=112, hidden_size=64, intermediate_size=144, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                  rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", dict(vocab_size=120, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                  rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(vocab_size=104, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                  max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                  tie_word_embeddings=False)),
    # a sliding window of 5 over the 14 tokens compared; Phi-3 with fused qkv_proj/gate_up_proj
    "mistral": ("MistralConfig", dict(vocab_size=112, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=128, sliding_window=5, rms_norm_eps=1e-5,
                                      rope_theta=10000.0, tie_word_embeddings=False)),
    "phi3": ("Phi3Config", dict(vocab_size=108, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                original_max_position_embeddings=128, sliding_window=5, rms_norm_eps=1e-5,
                                rope_theta=10000.0, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                                eos_token_id=2)),
    # long-context RoPE (issue 45): compared at a length within the original context and one
    # past it (dynamic: past max_position_embeddings), where the long factors, YaRN's blend and
    # attention factor, or the grown NTK base rotate every key
    "llama_yarn": ("LlamaConfig", dict(vocab_size=112, hidden_size=64, intermediate_size=144, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                                       rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 32})),
    "qwen2_dynamic": ("Qwen2Config", dict(vocab_size=120, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                          rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
                                          rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
    "phi3_longrope": ("Phi3Config", dict(vocab_size=108, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                         original_max_position_embeddings=32, rms_norm_eps=1e-5, rope_theta=10000.0,
                                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                         rope_scaling={"type": "longrope",
                                                       "short_factor": [1.0, 1.02, 1.1, 1.3, 1.6, 2.0, 2.4, 2.8],
                                                       "long_factor": [1.0, 1.3, 2.2, 4.1, 7.7, 12.0, 19.0, 31.0]})),
    # Phi-4-mini's partial rotary: 12 of head_dim 16 rotate (its 96 of 128), 6 pairs of factors
    "phi3_partial": ("Phi3Config", dict(vocab_size=108, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        original_max_position_embeddings=32, rms_norm_eps=1e-5, rope_theta=10000.0,
                                        partial_rotary_factor=0.75, tie_word_embeddings=True, pad_token_id=0,
                                        bos_token_id=1, eos_token_id=2,
                                        rope_scaling={"type": "longrope",
                                                      "short_factor": [1.0, 1.05, 1.2, 1.5, 1.9, 2.4],
                                                      "long_factor": [1.0, 1.6, 3.4, 7.5, 15.0, 30.0]})),
}
CLRT_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
              "mistral": "MistralForCausalLM", "phi3": "Phi3ForCausalLM", "llama_yarn": "LlamaForCausalLM",
              "qwen2_dynamic": "Qwen2ForCausalLM", "phi3_longrope": "Phi3ForCausalLM",
              "phi3_partial": "Phi3ForCausalLM"}
MODEL_TYPES = {"llama_yarn": "llama", "qwen2_dynamic": "qwen2", "phi3_longrope": "phi3", "phi3_partial": "phi3"}
# the token counts compared: 14, and for the RoPE variants 48 too (past 32)
LENGTHS = {a: (14, 48) if a in MODEL_TYPES else (14,) for a in ARCHS}


def tokens_for(vocab, n=14, seed=5):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def hf_logits(model, tokens):
    import torch
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def hf_prefix_logits(model, tokens):
    """Row t: the last logits of a fresh forward over tokens[:t + 1] (transformers picks
    longrope's factors and dynamic NTK's base by each call's length)."""
    import torch
    rows = []
    for t in range(len(tokens)):
        m = load_fresh(model)
        rows.append(hf_logits(m, tokens[: t + 1])[-1])
    return torch.stack(rows)


def load_fresh(model):
    """A model whose rotary state is as loaded (dynamic NTK keeps the largest length it saw)."""
    for mod in model.modules():
        if hasattr(mod, "original_inv_freq") and hasattr(mod, "inv_freq"):
            mod.inv_freq = mod.original_inv_freq.clone()
            if hasattr(mod, "original_max_seq_len"):
                mod.max_seq_len_cached = mod.original_max_seq_len
    return model


def load_hf(folder):
    import torch
    import transformers
    # transformers 5 names the argument dtype, 4.x torch_dtype (which 5 still reads, with a warning)
    major = int(transformers.__version__.split(".")[0])
    kw = {"dtype": torch.float32} if major >= 5 else {"torch_dtype": torch.float32}
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", **kw).eval()


def make_hf_model(arch, folder):
    """A transformers model of `arch` with every weight perturbed, saved with save_pretrained."""
    import torch
    import transformers
    cls, kw = ARCHS[arch]
    cfg = getattr(transformers, cls)(**kw)
    torch.manual_seed(11)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1 and "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.3 * torch.randn_like(p))      # Qwen2's q/k/v biases start at zero
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))
    model.save_pretrained(folder)
    return model


def check_transformers_to_clrt(clrt, work, devices, folders):
    why = missing("torch", "transformers", "safetensors")
    if why:
        return report("transformers_to_clrt", "SKIP", why)
    for arch in ARCHS:
        name = f"transformers_to_clrt[{arch}]"
        try:
            folder = os.path.join(work, f"hf_{arch}")
            model = make_hf_model(arch, folder)
            folders[arch] = folder
            for n in LENGTHS[arch]:
                toks = tokens_for(ARCHS[arch][1]["vocab_size"], n=n)
                pre = hf_prefix_logits(model, toks) if arch in MODEL_TYPES else None
                ref = hf_logits(load_fresh(model), toks)
                for dev in devices:
                    ok, detail = compare_logits(name, clrt.logits(folder, toks, dev), ref, toks, 1e-4 if dev == "cpu" else 1e-3, pre)
                    report(f"{name}[{dev}][T={n}]", "PASS" if ok else "FAIL", detail)
        except Exception:
            report(name, "FAIL", traceback.format_exc()[-1500:])


def check_clrt_to_transformers(clrt, work, devices):
    why = missing("torch", "transformers", "safetensors")
    if why:
        return report("clrt_to_transformers", "SKIP", why)
    for arch, (_, kw) in ARCHS.items():
        name = f"clrt_to_transformers[{arch}]"
        try:
            folder = os.path.join(work, f"clrt_{arch}")
            cfg = dict(kw, architectures=[CLRT_ARCHS[arch]], model_type=MODEL_TYPES.get(arch, arch), hidden_act="silu")
            cfg_file = os.path.join(work, f"clrt_{arch}.json")
            with open(cfg_file, "w") as f:
                json.dump(cfg, f)
            clrt("new", cfg_file, 7, folder)
            model = load_hf(folder)
            for n in LENGTHS[arch]:
                toks = tokens_for(kw["vocab_size"], n=n, seed=9)
                pre = hf_prefix_logits(model, toks) if arch in MODEL_TYPES else None
                ref = hf_logits(load_fresh(model), toks)
                for dev in devices:
                    ok, detail = compare_logits(name, clrt.logits(folder, toks, dev), ref, toks, 1e-4 if dev == "cpu" else 1e-3, pre)
                    report(f"{name}[{dev}][T={n}]", "PASS" if ok else "FAIL", detail)
        except Exception:
            report(name, "FAIL", traceback.format_exc()[-1500:])


def check_dtype_round_trip(clrt, work):
    """A config carrying transformers 5's `dtype: bfloat16` (what a v5 checkpoint has), saved by
    clrt (f32 weights): transformers with dtype "auto" must reload it as float32, not bf16."""
    why = missing("torch", "transformers", "safetensors")
    if why:
        return report("dtype_round_trip", "SKIP", why)
    import torch
    import transformers
    try:
        kw = ARCHS["qwen3"][1]
        cfg = dict(kw, architectures=[CLRT_ARCHS["qwen3"]], model_type="qwen3", hidden_act="silu",
                   dtype="bfloat16", torch_dtype="bfloat16")
        cfg_file = os.path.join(work, "dtype.json")
        with open(cfg_file, "w") as f:
            json.dump(cfg, f)
        folder = os.path.join(work, "clrt_dtype")
        clrt("new", cfg_file, 7, folder)
        major = int(transformers.__version__.split(".")[0])
        auto = {"dtype": "auto"} if major >= 5 else {"torch_dtype": "auto"}
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, **auto)
        dtypes = sorted({str(p.dtype) for p in model.parameters()})
        with open(os.path.join(folder, "config.json")) as f:
            saved = json.load(f)
        ok = dtypes == [str(torch.float32)] and saved.get("dtype") == "float32" and saved.get("torch_dtype") == "float32"
        report("dtype_round_trip", "PASS" if ok else "FAIL",
               f"config dtype {saved.get('dtype')!r}, torch_dtype {saved.get('torch_dtype')!r}; reloaded as {dtypes}")
    except Exception:
        report("dtype_round_trip", "FAIL", traceback.format_exc()[-1500:])


def check_lora_peft(clrt, work, devices, folders):
    why = missing("torch", "transformers", "peft", "safetensors")
    if why:
        return report("lora_peft", "SKIP", why)
    import peft
    cases = [("qwen2", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"),
             ("llama", "v_proj,down_proj,lm_head,embed_tokens"),
             ("phi3", "qkv_proj,o_proj,gate_up_proj,down_proj")]
    for arch, targets in cases:
        name = f"lora_peft[{arch}:{targets}]"
        try:
            base = folders.get(arch)
            if not base:
                report(name, "SKIP", "no transformers folder (transformers_to_clrt did not run)")
                continue
            adir = os.path.join(work, f"adapter_{arch}")
            toks = tokens_for(ARCHS[arch][1]["vocab_size"], seed=13)
            tok_file = os.path.join(work, "lora_tokens.json")
            with open(tok_file, "w") as f:
                json.dump(toks, f)
            clrt("lora", base, adir, tok_file, "r=4", f"targets={targets}")
            model = peft.PeftModel.from_pretrained(load_hf(base), adir).eval()
            unmerged = hf_logits(model, toks)
            merged = hf_logits(model.merge_and_unload(), toks)
            plain = hf_logits(load_hf(base), toks)
            moved = (unmerged - plain).abs().max().item()
            if not moved > 1e-3:
                report(name, "FAIL", f"the adapters change no logit (max {moved:.2e}): B stayed zero or PEFT ignored them")
                continue
            for dev in devices:
                got = clrt.logits(base, toks, dev, adir)
                ok1, d1 = compare_logits(name, got, unmerged, toks, 1e-4 if dev == "cpu" else 1e-3)
                ok2, d2 = compare_logits(name, got, merged, toks, 1e-4 if dev == "cpu" else 1e-3)
                report(f"{name}[{dev}]", "PASS" if ok1 and ok2 else "FAIL",
                       f"PeftModel {d1}; merged {d2}; adapters move logits by {moved:.3g}")
        except Exception:
            report(name, "FAIL", traceback.format_exc()[-1500:])


def check_tokenizer(clrt, work):
    why = missing("tokenizers")
    if why:
        return report("tokenizer", "SKIP", why)
    import tokenizers
    try:
        with open(os.path.join(ROOT, "tests", "fixtures", "tokenizer", "corpus.json")) as f:
            corpus = json.load(f)
        train = os.path.join(work, "tok_train.txt")
        with open(train, "w") as f:
            f.write("\n".join(s.replace("\n", " ") for s in corpus[::2]))
        folder = os.path.join(work, "tokenizer")
        clrt("train_tokenizer", train, 1200, folder)
        texts = corpus + ["", " ", "  leading and trailing  ", "naïve café ☕ — 東京 🚀\n\ttabs",
                          "<|im_start|>user\nhi<|im_end|>", "12345 678.9e-3", "don't WON'T it's"]
        tfile = os.path.join(work, "texts.json")
        with open(tfile, "w") as f:
            json.dump(texts, f)
        out = os.path.join(work, "ids.json")
        clrt("encode", folder, tfile, out)
        with open(out) as f:
            ours = json.load(f)["ids"]
        hf = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
        bad = [i for i in range(len(texts)) if ours[i] != theirs[i]]
        n_ids = sum(len(t) for t in theirs)
        if bad:
            i = bad[0]
            report("tokenizer", "FAIL", f"{len(bad)} of {len(texts)} texts differ; first {texts[i][:80]!r}: "
                                        f"clrt {ours[i][:20]} tokenizers {theirs[i][:20]}")
        else:
            report("tokenizer", "PASS", f"{len(texts)} texts, {n_ids} ids equal (vocab {hf.get_vocab_size()})")
    except Exception:
        report("tokenizer", "FAIL", traceback.format_exc()[-1500:])


def check_tensorboard(clrt, work):
    why = missing("tensorboard", "numpy")
    if why:
        return report("tensorboard", "SKIP", why)
    try:
        import numpy as np
        from tensorboard.backend.event_processing import event_accumulator as ea_mod
        from tensorboard.util import tensor_util
        folder = os.path.join(work, "tb")
        shutil.rmtree(folder, ignore_errors=True)
        out = os.path.join(work, "tb_written.json")
        clrt("tensorboard", folder, out)
        with open(out) as f:
            written = json.load(f)
        acc = ea_mod.EventAccumulator(folder, size_guidance={ea_mod.SCALARS: 0, ea_mod.TENSORS: 0})
        acc.Reload()
        tags = acc.Tags()
        problems = []
        for step, tag, value in written["scalars"]:
            found = [e.value for e in acc.Scalars(tag) if e.step == step] if tag in tags.get("scalars", []) else []
            if not found:
                problems.append(f"scalar {tag}@{step} missing (tags {tags.get('scalars')})")
            elif found[0] != float(np.float32(value)):
                problems.append(f"scalar {tag}@{step}: read {found[0]!r}, written {value!r}")
        for step, tag, text in written["texts"]:
            cands = [t for t in tags.get("tensors", []) if t.startswith(tag)]
            got = [tensor_util.make_ndarray(e.tensor_proto) for t in cands for e in acc.Tensors(t) if e.step == step]
            vals = [v.item() if v.shape == () else v.flat[0] for v in got]
            vals = [v.decode() if isinstance(v, bytes) else v for v in vals]
            if text not in vals:
                problems.append(f"text {tag}@{step}: read {vals!r} (tensor tags {tags.get('tensors')})")
        if problems:
            report("tensorboard", "FAIL", "; ".join(problems[:5]))
        else:
            report("tensorboard", "PASS", f"{len(written['scalars'])} scalars and {len(written['texts'])} text read back "
                                          f"by tensorboard's EventAccumulator")
    except Exception:
        report("tensorboard", "FAIL", traceback.format_exc()[-1500:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clrt", default=os.environ.get("CLRT_BIN", os.path.join(ROOT, "build", "release", "clrt")))
    ap.add_argument("--work", default=None, help="folder for the models and files (default: a temporary one)")
    ap.add_argument("--device-also", default=None, help="cuda: clrt's logits on the GPU too")
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    if not os.access(a.clrt, os.X_OK):
        print(f"hf_checks: no clrt binary at {a.clrt}")
        return 2
    work = a.work or tempfile.mkdtemp(prefix="clrt_hf_")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    clrt = Clrt(a.clrt, work)
    devices = ["cpu"] + ([a.device_also] if a.device_also else [])
    only = set(a.only.split(",")) if a.only else None
    folders = {}
    try:
        for name, run in [("transformers_to_clrt", lambda: check_transformers_to_clrt(clrt, work, devices, folders)),
                          ("clrt_to_transformers", lambda: check_clrt_to_transformers(clrt, work, devices)),
                          ("dtype_round_trip", lambda: check_dtype_round_trip(clrt, work)),
                          ("lora_peft", lambda: check_lora_peft(clrt, work, devices, folders)),
                          ("tokenizer", lambda: check_tokenizer(clrt, work)),
                          ("tensorboard", lambda: check_tensorboard(clrt, work))]:
            if only is None or name in only:
                run()
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    counts = {s: sum(1 for _, st in results if st == s) for s in ("PASS", "FAIL", "SKIP")}
    print(f"hf_checks: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    print(f"FIGURE hf_pass={counts['PASS']} hf_fail={counts['FAIL']} hf_skip={counts['SKIP']}")
    if counts["FAIL"]:
        return 1
    if counts["PASS"] == 0:
        print("skipped: every Hugging Face check lacks its library here")
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
