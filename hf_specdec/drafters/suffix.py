"""Suffix decoding (after SuffixDecoding, Oliaro et al., arXiv 2411.04975): draft what followed the current text's
longest suffix in earlier calls' prompts and outputs, and in the current sequence itself; no model, no training.

Two sources, searched at every step:
- the current sequence (its prompt and its output so far): an n-gram index with counts, updated as tokens arrive;
- every earlier call on the same target (`SuffixIndex`, kept with the target across calls, threads and both routes
  into `generate()`): a suffix array over their token sequences, so that the suffix of any length up to `depth` is
  found by binary search, and the continuations of a match are a contiguous, sorted range of it.
From each source the drafter grows a tree best-first: a node's children are the tokens that followed its path in that
source, each with the share of occurrences it took. A node's chance to be accepted once its parent is, min(1, share x
rate), is calibrated on what the target accepted so far (`_Acceptance`: a rate per source and match length, since a
one-token match's shares promise more than it keeps), and its score is the product of those chances along its path.
The source whose tree scores higher drafts; nodes below `min_probability` are left out, and `max_tokens` caps them.
Under `draft_length="adaptive"` (the default at batch 1) the drafter sizes each tree itself (`_sized`): the number of
nodes with the most expected tokens per second, from the nodes' own chances and the step costs the policy measured;
an average acceptance by node position would cut a confident long draft short and pad a doubtful one. As the first
part of a fallback drafter (`"suffix+distilled"`) it drafts only where it expects more than the other part would
give, which leaves fresh text to the model. Nodes come likeliest first with parents first, as the loop needs.

At batch 1 the tree is verified in one forward with a tree attention mask; in a batch, or where a tree cannot be
verified (sliding-window attention, flash attention, convolution layers over recent slots), each row drafts the tree's
likeliest path as a chain. Drafts are deterministic (q one-hot), so greedy and sampled decoding stay exact.

Memory: the index keeps its tokens and their suffix array, 8 bytes per token (int32 each), up to `max_tokens` tokens
(oldest calls evicted first); building the array takes about 40 bytes per token for a moment.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import heapq
import json
import os
import threading
from dataclasses import dataclass

import numpy as np
import torch

from ..cache.ragged import has_sliding_window, mixes_slots, takes_4d_masks
from ..errors import InputError
from ..tree import Tree
from .base import Draft, Drafter
from .ngram import NgramIndex

SEPARATOR = -1  # between two documents of the index: no pattern (token ids >= 0) matches across it


def suffix_order(tokens: np.ndarray, depth: int) -> np.ndarray:
    """The suffixes of `tokens` (int32) sorted by their first `depth` tokens (prefix doubling: log2(depth) sorts)."""
    n = len(tokens)
    rank = tokens.astype(np.int64) + 2  # separators rank 1, the end of the array 0
    order = np.argsort(rank, kind="stable")
    k = 1
    while k < depth and n:
        following = np.zeros(n, dtype=np.int64)
        if k < n:
            following[: n - k] = rank[k:]
        order = np.lexsort((following, rank))
        r, f = rank[order], following[order]
        new = np.empty(n, dtype=bool)
        new[0] = True
        new[1:] = (r[1:] != r[:-1]) | (f[1:] != f[:-1])
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.cumsum(new)
        if rank.max(initial=0) == n:  # every suffix already told apart
            break
        k *= 2
    return order.astype(np.int32)


_BUILDER: list = []  # the one thread that sorts every index's arrays (made at the first addition)
_BUILDER_LOCK = threading.Lock()


def on_builder_thread(build):
    """`build()`, run on one thread kept for it and waited for. A sort's temporary arrays (several times the index's
    size) then come from that thread's allocator arena alone: sorted on every serving thread, each arena would keep
    its own high-water mark, and resident memory would grow with the number of threads."""
    with _BUILDER_LOCK:
        if not _BUILDER:
            _BUILDER.append(concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf_specdec-suffix"))
    return _BUILDER[0].submit(build).result()


# a forked child (a server's worker processes) has no builder thread: it makes its own
os.register_at_fork(after_in_child=_BUILDER.clear)


class SuffixArray:
    """The suffix array of a token sequence (documents separated by SEPARATOR), sorted to `depth` tokens."""

    def __init__(self, tokens: np.ndarray, depth: int):
        self.tokens, self.depth = tokens, depth
        self.order = suffix_order(tokens, depth)

    def __len__(self) -> int:
        return len(self.tokens)

    def _compare(self, position: int, pattern: list[int]) -> int:
        """-1, 0 or 1 as the suffix at `position` sorts before, starts with, or sorts after `pattern` (lists compare
        as the suffix array sorts: a separator, -1, before every token, and a suffix that ends first, first)."""
        window = self.tokens[position : position + len(pattern)].tolist()
        return 0 if window == pattern else -1 if window < pattern else 1

    def range_of(self, pattern, lo: int = 0, hi: int | None = None) -> tuple[int, int]:
        """[lo, hi): the suffixes that start with `pattern` (within a range known to hold them all)."""
        hi = len(self.order) if hi is None else hi
        pattern = [int(token) for token in pattern]
        a, b = lo, hi
        while a < b:  # the first suffix not before the pattern
            mid = (a + b) // 2
            if self._compare(int(self.order[mid]), pattern) < 0:
                a = mid + 1
            else:
                b = mid
        start, b = a, hi
        while a < b:  # the first suffix after it
            mid = (a + b) // 2
            if self._compare(int(self.order[mid]), pattern) <= 0:
                a = mid + 1
            else:
                b = mid
        return start, a

    def children(self, lo: int, hi: int, matched: int) -> list[tuple[int, int, int, int]]:
        """(token, count, lo, hi) of what follows the `matched` tokens the suffixes in [lo, hi) start with."""
        positions = self.order[lo:hi].astype(np.int64) + matched
        inside = positions < len(self.tokens)
        following = np.full(hi - lo, SEPARATOR, dtype=np.int64)
        following[inside] = self.tokens[positions[inside]]
        # sorted within the range (the suffixes are sorted by these tokens next), so each token is a sub-range
        tokens, starts, counts = np.unique(following, return_index=True, return_counts=True)
        return [(int(t), int(c), lo + int(s), lo + int(s) + int(c)) for t, s, c in zip(tokens, starts, counts)
                if t != SEPARATOR]


class SuffixIndex:
    """Earlier calls' token sequences, searchable by any suffix up to `depth` tokens, bounded to `max_tokens`.

    Thread-safe: `add` and `clear` take a lock; a lookup reads a snapshot (the arrays are replaced, never changed).
    New documents go to a small array rebuilt at each addition; when it grows past a tenth of the large one (at least
    `merge_tokens`), both are merged into one rebuild, evicting the oldest documents past `max_tokens`.
    """

    def __init__(self, max_tokens: int = 1_000_000, depth: int = 32, merge_tokens: int = 32_768):
        if not (isinstance(max_tokens, int) and max_tokens > 0 and isinstance(depth, int) and depth >= 2):
            raise InputError(f"A suffix index needs max_tokens >= 1 and depth >= 2, got {max_tokens}, {depth}.")
        self.max_tokens, self.depth, self.merge_tokens = max_tokens, depth, merge_tokens
        self._lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        """Forget every document."""
        with getattr(self, "_lock", threading.Lock()):
            self._large_docs: list[np.ndarray] = []
            self._recent_docs: list[np.ndarray] = []
            self.arrays: tuple[SuffixArray, ...] = ()

    def __getstate__(self) -> dict:  # copies and pickles (`hf-specdec bench` copies each drafter) get a lock of their own
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def num_tokens(self) -> int:
        return sum(len(d) for d in self._large_docs) + sum(len(d) for d in self._recent_docs)

    @property
    def num_documents(self) -> int:
        return len(self._large_docs) + len(self._recent_docs)

    def nbytes(self) -> int:
        """Bytes the index holds (tokens and suffix arrays)."""
        return sum(a.tokens.nbytes + a.order.nbytes for a in self.arrays)

    def add(self, *documents) -> None:
        """Index token sequences (lists or 1-D tensors / arrays of token ids), e.g. a prompt and its answer."""
        docs = [np.asarray(d.tolist() if isinstance(d, torch.Tensor) else d, dtype=np.int32) for d in documents]
        docs = [d for d in docs if len(d) >= 2]
        if not docs:
            return
        with self._lock:
            self._recent_docs += docs
            recent = sum(len(d) for d in self._recent_docs)
            large = sum(len(d) for d in self._large_docs)
            if recent > max(self.merge_tokens, large // 10) or large + recent > self.max_tokens:
                self._large_docs += self._recent_docs
                self._recent_docs = []
                while len(self._large_docs) > 1 and sum(len(d) for d in self._large_docs) > self.max_tokens:
                    self._large_docs.pop(0)  # the oldest first
            parts = [docs for docs in (self._large_docs, self._recent_docs) if docs]
            self.arrays = on_builder_thread(lambda: tuple(SuffixArray(self._concat(docs), self.depth) for docs in parts))

    @staticmethod
    def _concat(docs: list[np.ndarray]) -> np.ndarray:
        out = np.full(sum(len(d) + 1 for d in docs), SEPARATOR, dtype=np.int32)
        at = 0
        for d in docs:
            out[at : at + len(d)] = d
            at += len(d) + 1
        return out

    def add_texts(self, texts, tokenizer) -> None:
        """Index texts (earlier answers, say), tokenized without special tokens."""
        self.add(*(tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts))

    def add_jsonl(self, path, tokenizer, field: str = "text") -> int:
        """Index the `field` of every line of a JSON-lines file (a corpus of earlier outputs); returns how many."""
        from ..errors import json_lines

        texts = [row[field] for _, row in json_lines(path, "add_jsonl") if isinstance(row.get(field), str)]
        self.add_texts(texts, tokenizer)
        return len(texts)

    def save(self, path) -> None:
        """Write the documents (in order) to `path` (.npz)."""
        with self._lock:
            docs = self._large_docs + self._recent_docs
        np.savez_compressed(path, tokens=np.concatenate(docs) if docs else np.zeros(0, np.int32),
                            lengths=np.array([len(d) for d in docs], dtype=np.int64),
                            settings=np.array(json.dumps({"max_tokens": self.max_tokens, "depth": self.depth})))

    def load(self, path) -> None:
        """Add the documents saved at `path` (.npz) to this index."""
        data = np.load(path)
        bounds = np.concatenate([[0], np.cumsum(data["lengths"])])
        self.add(*(data["tokens"][a:b] for a, b in zip(bounds[:-1], bounds[1:])))


@dataclass
class _Node:
    token: int
    parent: int  # its index in the same list (-1: the root)
    score: float  # its estimated chance to be accepted: the product of its path's conditional chances
    share: float  # the share of its parent's continuations it took (what `_Acceptance` calibrates)
    key: tuple  # (source kind, match-length bucket) of the match it continues
    state: object = None  # the source's state after this node's path


def _match_bucket(matched: int) -> int:
    """Match lengths 1, 2-3, 4-7, 8-15 and 16+: how far a continuation's share can be trusted depends on it (a one-token
    match continues as its share says a third to four fifths as often as an eight-token one, on the project's
    repeated workloads; deep in a long copy, nearly always)."""
    return min(matched.bit_length(), 5)


class _Acceptance:
    """How often a node whose parent was accepted is accepted, per share of its parent's continuations it took, by
    source kind and match length: a node's conditional chance is min(1, share x rate). Decayed counts, kept across
    calls; a prior of 0.7 over two pseudo-trials."""

    def __init__(self, decay: float = 0.99):
        self.decay, self.counts = decay, {}  # key -> [share-weighted trials, hits]

    def rate(self, key: tuple) -> float:
        trials, hits = self.counts.get(key, (0.0, 0.0))
        return (hits + 1.4) / (trials + 2.0)

    def record(self, nodes: list[_Node], path: set[int]) -> None:
        """A verified draft: each node whose parent was accepted was a trial (weighted by its share)."""
        for i, node in enumerate(nodes):
            if node.parent < 0 or node.parent in path:
                entry = self.counts.setdefault(node.key, [0.0, 0.0])
                entry[0] = self.decay * entry[0] + node.share
                entry[1] = self.decay * entry[1] + (i in path)


class _CorpusSource:
    """Continuations in the index: a state is (array, lo, hi, matched tokens)."""

    kind = "corpus"

    def __init__(self, array: SuffixArray):
        self.array = array

    def root(self, context: list[int]):
        """The state of the longest suffix of `context` the index holds (None: not even its last token)."""
        array = self.array
        longest = min(len(context), array.depth - 1)
        if not longest:
            return None
        best, low, high = None, 1, longest
        while low <= high:  # the longest matching suffix length, by bisection (a suffix of a match matches too)
            m = (low + high) // 2
            lo, hi = array.range_of(context[-m:])
            if hi > lo:
                best, low = (array, lo, hi, m), m + 1
            else:
                high = m - 1
        return best

    @staticmethod
    def expand(state):
        """(token, share, state) of each continuation, and the length of the match they continue."""
        array, lo, hi, matched = state[:4]
        total = hi - lo
        if matched < array.depth:  # within the sorted depth, a child is a sub-range of the suffix array
            return [(token, count / total, (array, a, b, matched + 1))
                    for token, count, a, b in array.children(lo, hi, matched)], matched
        # past it, the suffixes are no longer sorted by what follows: group their positions instead
        positions = state[4] if len(state) > 4 else array.order[lo:hi].astype(np.int64)
        at = positions + matched
        inside = at < len(array.tokens)
        positions, following = positions[inside], array.tokens[at[inside]]
        out = []
        for token in np.unique(following):
            if token != SEPARATOR:
                group = positions[following == token]
                out.append((int(token), len(group) / total, (array, 0, len(group), matched + 1, group)))
        return out, matched


class _SequenceSource:
    """Continuations in the current sequence: an n-gram index with counts; a state is the path's recent tokens."""

    kind = "sequence"

    def __init__(self, index: NgramIndex):
        self.index = index

    def root(self, context: list[int]):
        """The context's recent tokens, if the sequence holds a continuation of some suffix of them (else None)."""
        n, _ = self.index._longest_match(context[-self.index.max_n :])
        return tuple(context[-self.index.max_n :]) if n else None

    def expand(self, state):
        n, key = self.index._longest_match(list(state))
        if key is None:
            return [], 0
        followers = self.index.follow[key]
        total = sum(count for count, _ in followers.values())
        return [(token, count / total, (state + (token,))[-self.index.max_n :])
                for token, (count, _) in followers.items()], n


def _grow(source, context: list[int], budget: int, min_probability: float, max_depth: int,
          acceptance: _Acceptance) -> tuple[list[_Node], float]:
    """The best-first tree of up to `budget` nodes (parents first, likeliest first) and its summed scores. A node's
    chance is calibrated by the length of the match it continues (its parent's path extends the root's match)."""
    state = source.root(context)
    if state is None or budget <= 0:
        return [], 0.0
    nodes: list[_Node] = []
    depth = {-1: 0}
    frontier = [(-1.0, -1, 0, -1, 1.0, None, state)]  # (-score, parent, tie-break, token, share, key, state)
    tie = 0
    while frontier and len(nodes) < budget:
        neg, parent, _, token, share, key, state = heapq.heappop(frontier)
        if token >= 0:  # (the root is no node)
            nodes.append(_Node(token, parent, -neg, share, key, state))
            depth[len(nodes) - 1] = depth[parent] + 1
            parent = len(nodes) - 1
        if depth[parent] >= max_depth:
            continue
        children, matched = source.expand(state)
        key = (source.kind, _match_bucket(matched))
        rate = acceptance.rate(key)
        for child, child_share, child_state in children:
            score = -neg * min(1.0, child_share * rate)
            if score >= min_probability:
                tie += 1
                heapq.heappush(frontier, (-score, parent, tie, child, child_share, key, child_state))
    return nodes, sum(node.score for node in nodes)


class SuffixDrafter(Drafter):
    """Drafts a tree of what followed the current text's longest suffix in earlier calls and in the current sequence
    (see the module docstring).

    Args:
        index: the index of earlier calls (a name's drafter shares its target's: `for_target`); None: a new one.
        min_probability: a node's estimated chance to be accepted (its path's product of shares) to be drafted.
        max_depth: how deep a tree reaches.
        max_ngram: the longest suffix looked up in the current sequence.
    """

    default_num_draft_tokens = 16
    sizes_own_drafts = True  # from each node's estimated chance against the measured cost of a step (`_sized`)
    explore_every = 32

    def __init__(self, index: SuffixIndex | None = None, min_probability: float = 0.1, max_depth: int = 16,
                 max_ngram: int = 16):
        if not 0 < min_probability <= 1 or max_depth < 1:
            raise InputError(f"SuffixDrafter needs 0 < min_probability <= 1 and max_depth >= 1, got {min_probability}, "
                             f"{max_depth}.")
        self.index = index if index is not None else SuffixIndex()
        self.min_probability, self.max_depth, self.max_ngram = min_probability, max_depth, max_ngram
        self.sequences: list[NgramIndex] = []
        self.acceptance = _Acceptance()  # what its nodes' shares have been worth, kept across calls
        self.cut_trees = 0  # how many trees `_sized` cut short
        self.drafted: list[list[_Node]] = []  # per row, the nodes of its last draft ...
        self.drafted_after: list[int] = []  # ... and how many tokens the row held then

    @classmethod
    def for_target(cls, target, options=None) -> "SuffixDrafter":
        """The drafter of `assistant="suffix"`: every drafter of this target shares one index (kept with it)."""
        return cls(index=index_of(target))

    def __repr__(self) -> str:
        return f"SuffixDrafter({self.index.num_tokens} tokens indexed in {self.index.num_documents} documents)"

    def start(self, target, seqs, settings):
        super().start(target, seqs, settings)
        model = target.model
        trees = (seqs.size == 1 and takes_4d_masks(model) and not has_sliding_window(model.config)
                 and not mixes_slots(target.cache))
        self.shape = SuffixTree() if trees else SuffixChains()
        self.sequences = [NgramIndex(1, self.max_ngram, count=True) for _ in range(seqs.size)]
        self.rows = [seqs.tokens(b) for b in range(seqs.size)]  # the rows' own host lists: they grow in place
        self.drafted = [[] for _ in range(seqs.size)]

    def propose(self, seqs, max_tokens):
        arrays = self.index.arrays  # one snapshot for the step
        drafts = []
        for b, sequence in enumerate(self.sequences):
            context = seqs.tokens(b)
            sequence.extend(context[len(sequence) :])
            tree = self.grow(context, sequence, arrays, self.shape.budget(max_tokens))
            drafts.append(self._sized(self.shape.nodes(tree, max_tokens)))
        self.drafted, self.drafted_after = drafts, [len(seqs.tokens(b)) for b in range(seqs.size)]
        return self.shape.draft(drafts, seqs.ids(0).device)

    def grow(self, context: list[int], sequence: NgramIndex, arrays, budget: int) -> list[_Node]:
        """The likelier tree of the two sources' for `context` (the current sequence's n-gram index, and the index's
        arrays), up to `budget` nodes, before sizing (`benchmarks/suffix_replay.py` replays outputs through it)."""
        best, best_score = [], 0.0
        for source in [_SequenceSource(sequence), *map(_CorpusSource, arrays)]:
            nodes, score = _grow(source, context, budget, self.min_probability, self.max_depth, self.acceptance)
            if score > best_score:
                best, best_score = nodes, score
        return best

    def _sized(self, nodes: list[_Node]) -> list[_Node]:
        """The first n of `nodes` (scores never rise along them) with the most expected tokens per second: a step
        emits 1 + the sum of its nodes' chances and costs what this run measured a forward verifying n drafts to cost
        (the drafting is spent either way). None of them where a plain step, or the drafter a fallback would use
        instead (`rival_rate`), is expected to do better. Unmeasured: all of them; and every `explore_every`-th tree
        that would be cut goes out whole, so that wide forwards are measured, not extrapolated from narrow ones (an
        extrapolated cost of 16 drafts came out 211 ms against 110 ms measured, and kept sure copies at 4 nodes)."""
        cost = self.settings.verify_cost
        if not nodes or cost is None or cost(0) is None:
            return nodes
        best, best_rate, gain = 0, max(1.0 / cost(0), self.rival_rate or 0.0), 1.0
        for n, node in enumerate(nodes, start=1):
            gain += node.score
            rate = gain / cost(n)
            if rate > best_rate:
                best, best_rate = n, rate
        if 0 < best < len(nodes):
            self.cut_trees += 1
            if self.cut_trees % self.explore_every == 0:
                return nodes
        return nodes[:best]

    def accepted(self, seqs, verified):
        for b, (nodes, num) in enumerate(zip(self.drafted, verified.num_accepted)):
            if nodes and (verified.mine is None or verified.mine[b]):
                # the accepted path: the tokens kept after the draft's start, followed down the draft
                start, path, node = self.drafted_after[b], set(), -1
                for token in seqs.tokens(b)[start : start + num]:  # (fewer where the row stopped inside them)
                    node = next(i for i, n in enumerate(nodes) if n.parent == node and n.token == token)
                    path.add(node)
                self.acceptance.record(nodes, path)
        self.drafted = [[] for _ in self.drafted]  # (a fallback drafter may not ask this one next step)

    def select_rows(self, rows):
        """Rows that leave the batch have finished: their sequences join the index."""
        kept = set(rows)
        self.index.add(*(row for b, row in enumerate(self.rows) if b not in kept))
        self.rows = [self.rows[b] for b in rows]
        self.sequences = [self.sequences[b] for b in rows]
        self.drafted = [self.drafted[b] for b in rows]
        self.drafted_after = [self.drafted_after[b] for b in rows]

    def end(self) -> None:
        """The call is over: the rows still held join the index."""
        self.index.add(*self.rows)
        self.rows, self.sequences = [], []


class SuffixTree:
    """One row, a target that takes tree masks: the grown tree itself is the draft."""

    def budget(self, max_tokens: int) -> int:
        return max_tokens

    def nodes(self, tree: list[_Node], max_tokens: int) -> list[_Node]:
        return tree

    def draft(self, drafts: list[list[_Node]], device) -> Draft:
        (nodes,) = drafts
        if not nodes:
            return Draft.empty(1, device)
        tokens = torch.tensor([[n.token for n in nodes]], dtype=torch.long, device=device)
        return Draft(tokens, tree=Tree([n.parent for n in nodes]))


class SuffixChains:
    """Batches, or targets that cannot verify trees: each row's likeliest path, a chain."""

    def budget(self, max_tokens: int) -> int:
        return max_tokens * 8  # a chain is a tree's likeliest path: grow a wider tree to find it deep enough

    def nodes(self, tree: list[_Node], max_tokens: int) -> list[_Node]:
        path = _likeliest_path(tree)[:max_tokens]
        return [dataclasses.replace(node, parent=i - 1) for i, node in enumerate(path)]  # (parents in the chain)

    def draft(self, drafts: list[list[_Node]], device) -> Draft:
        width = max(len(c) for c in drafts)
        tokens = torch.tensor([[n.token for n in c] + [0] * (width - len(c)) for c in drafts], dtype=torch.long)
        return Draft(tokens.to(device), None, [len(c) for c in drafts])


def _likeliest_path(nodes: list[_Node]) -> list[_Node]:
    """The tree's likeliest root-to-leaf path (nodes are likeliest first, parents first)."""
    path, node = [], 0 if nodes else -1
    while node >= 0:
        path.append(nodes[node])
        children = [i for i, n in enumerate(nodes) if n.parent == node]
        node = children[0] if children else -1
    return path


def index_of(target) -> SuffixIndex:
    """The suffix index kept with `target` (what `assistant="suffix"` drafts from): clear, save, load or add to it."""
    return target.__dict__.setdefault("_hf_specdec_suffix_index", SuffixIndex())


__all__ = ["SuffixDrafter", "SuffixIndex", "SuffixArray", "suffix_order", "index_of"]
