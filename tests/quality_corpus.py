"""Documents whose quality is known, built in code for the quality tests and benchmark.

Reference-like: real prose already on the machine, the docstrings of standard-library modules, classes
and functions. Junk, generated with a seeded RNG: SEO keyword pages and navigation/boilerplate pages
(what the classifier is for), and word salad (a reference document's own words in random order: the
vocabulary of good text without its fluency, which a bag of n-grams barely sees and perplexity does).
"""

from __future__ import annotations

import functools
import json
import random
import subprocess
import sys

from kiln.quality.classifier import Example

MODULES = ("argparse asyncio collections concurrent.futures contextlib csv dataclasses datetime decimal difflib "
           "email enum fractions functools gzip hashlib heapq http.client inspect io ipaddress itertools json "
           "logging mailbox multiprocessing pathlib pickle queue random re shutil socket sqlite3 statistics "
           "string subprocess tarfile tempfile textwrap threading tkinter unittest urllib.parse uuid "
           "wave xml.dom.minidom zipfile zoneinfo").split()
PRODUCTS = ("running shoes|wireless earbuds|kitchen knives|gaming laptop|coffee maker|office chair|air fryer|"
            "phone case|vacuum cleaner|smart watch|hiking boots|yoga mat|car insurance|payday loans").split("|")
SPAM = ["Best {p} {y} - buy cheap {p} online.", "Top 10 {p} deals, {p} discount, {p} sale today!",
        "Click here to get the best {p} at the lowest price.", "Free shipping on all {p}. Order {p} now!!!",
        "{p} reviews {p} coupon {p} near me {p} cheap {p} best price.", "Limited offer: {n}% off {p}, hurry!",
        "Why pay more? Our {p} are the #1 choice of {n},000 happy customers.", "Shop {p} | {p} outlet | {p} store"]
NAV = ["Home", "About us", "Contact", "Login", "Sign up", "Privacy policy", "Terms of service", "Sitemap", "Cart",
       "FAQ", "Subscribe to our newsletter", "Follow us on social media", "Cookie settings", "Careers", "Blog"]


_COLLECT = """
import importlib, inspect, json, sys
seen, out = set(), []
for name in sys.argv[2:]:
    try:
        module = importlib.import_module(name)
    except ImportError:
        continue
    for obj in [module, *(v for _, v in sorted(vars(module).items()) if inspect.isclass(v) or inspect.isfunction(v))]:
        doc = inspect.getdoc(obj) or ""
        if len(doc) >= int(sys.argv[1]) and doc not in seen:
            seen.add(doc)
            out.append(doc)
json.dump(out, sys.stdout)
"""


def reference_texts(min_chars: int = 200) -> list[str]:
    """Distinct docstrings of at least `min_chars` characters, in a fixed order. Read in a fresh interpreter with
    nothing but the standard library (-I -S): in this process, what earlier tests imported may have patched those
    modules (an import in the suite replaces `inspect.isgenerator` by a wrapper without docstring), and the corpus,
    and every model trained on it, changed with the order the tests ran in."""
    return list(_reference_texts(min_chars))


@functools.cache
def _reference_texts(min_chars: int) -> tuple[str, ...]:
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _COLLECT, str(min_chars), *MODULES],
                          capture_output=True, text=True, check=True)
    return tuple(json.loads(done.stdout))


def spam_text(rng: random.Random) -> str:
    p = rng.choice(PRODUCTS)
    return " ".join(rng.choice(SPAM).format(p=p, y=rng.randint(2015, 2026), n=rng.randint(10, 90))
                    for _ in range(rng.randint(4, 12)))


def navigation_text(rng: random.Random) -> str:
    lines = rng.sample(NAV, rng.randint(6, len(NAV)))
    return "\n".join(lines + [f"Copyright © {rng.randint(2010, 2026)} {rng.choice(PRODUCTS).title()} Inc. "
                              "All rights reserved."])


def word_salad(text: str, rng: random.Random) -> str:
    words = text.split()
    rng.shuffle(words)
    return " ".join(words)


def junk_texts(n: int, seed: int = 0) -> list[str]:
    """n junk pages, each keyword spam or navigation boilerplate (a coin flip)."""
    rng = random.Random(seed)
    return [spam_text(rng) if rng.random() < 0.5 else navigation_text(rng) for _ in range(n)]


def labelled_split(seed: int = 0) -> tuple[list[Example], list[Example], list[Example], list[Example]]:
    """(train positives, train negatives, test positives, test negatives): every other document is a test one."""
    refs = reference_texts()
    junk = junk_texts(len(refs), seed)
    pos = [Example(f"ref-{i}", "reference", t) for i, t in enumerate(refs)]
    neg = [Example(f"junk-{i}", "web", t) for i, t in enumerate(junk)]
    return pos[::2], neg[::2], pos[1::2], neg[1::2]


def train_reference_model(texts: list[str], root, steps: int = 300, seq_len: int = 64, seed: int = 0):
    """A tiny Kiln model trained in-process on `texts` (plain torch, no DeepSpeed), saved the way a
    checkpoint export is (model.safetensors, model_config.json) with its tokenizer.model beside it."""
    import shutil
    from pathlib import Path

    import numpy as np
    import torch

    from kiln.tokens.tokenizer import Tokenizer
    from tests.token_corpus import train_small_tokenizer, write_source
    from training_jobs.export import save_safetensors
    from training_jobs.model import ModelConfig, Transformer

    root = Path(root)
    tok_dir = train_small_tokenizer(root, [write_source(root, "reference", texts, domain="reference")])
    tok = Tokenizer.load(tok_dir)
    stream = np.array([t for ids in tok.encode_batch(texts) for t in (*ids, tok.eos_id)], dtype=np.int64)
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_hidden=192,
                      max_seq_len=256)
    # Nothing from the caller's state: the weights from the model's own generator, batches from `seed`, one torch
    # thread (a reduction's order follows the thread count), the global RNG forked and the thread count restored.
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = Transformer(cfg, seed=seed)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
            rng = np.random.default_rng(seed)
            for _ in range(steps):
                starts = rng.integers(0, len(stream) - seq_len - 1, size=16)
                batch = torch.as_tensor(np.stack([stream[s:s + seq_len + 1] for s in starts]))
                loss = model(batch[:, :-1], batch[:, 1:])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    out = root / "reference_model"
    save_safetensors(model.state_dict(), cfg, out)
    shutil.copy(tok_dir / "tokenizer.model", out / "tokenizer.model")
    return out, loss.item()
