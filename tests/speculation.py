"""What every exactness test needs besides the comparison: proof that the speculative path it names really ran.

"Identical to plain generate()" holds trivially when no draft is ever accepted, and a chi-square passes trivially when
nothing is proposed. So each test collects a `SpeculationStats` over its calls and asserts, with `assert_speculated`,
that drafts were proposed and accepted (and rejected, where it claims the rejection path) at every draft position or
tree depth it claims, in every batch row it claims, with fewer target forwards than tokens.

Also here: drafters built to agree with tiny random targets (so that deep drafts are accepted often enough to be
tested), an adaptive length policy with scripted step costs (so that drafting pays and the test is deterministic),
left padding for batches, and drafters that record what they are handed.
"""

from __future__ import annotations

import torch

from hf_specdec import MedusaConfig, MedusaHeads
from hf_specdec.generation.draft_length import AdaptiveDraftLength, CalibratedDraftLength
from hf_specdec.drafters import CrossTokenizerDrafter, EagleDrafter
from hf_specdec.kinds.draft_model.model import SpecDrafterForCausalLM, drafter_config_from_target
from hf_specdec.cache.hidden import entering_layers, final_norm
from hf_specdec.kinds.block.model import BlockDrafterConfig, BlockDrafterModel
from hf_specdec.kinds.eagle3.model import Eagle3Config, Eagle3DraftModel


def assert_speculated(stats, *, depth: int = 1, rejected: bool = True, rows: int = 0, uneven: bool = False,
                      row_groups: int = 0, what: str = "") -> None:
    """Fail unless `stats` shows real speculation.

    depth: draft positions (tree depths) 1..depth each had drafts proposed AND accepted.
    rejected: some drafts were rejected too (the roll-back path ran).
    rows: batch rows 0..rows-1 each had drafts accepted.
    uneven: in some batched step the rows accepted different numbers of drafts (ragged cache holes).
    row_groups: the batch rows split into this many equal groups (one prompt repeated in each) each had drafts accepted.
    """
    s, label = stats, f"{what}: " if what else ""
    assert s.drafted_tokens > 0, f"{label}nothing was drafted: {s.as_dict()}"
    assert s.accepted_tokens > 0, f"{label}no draft was accepted, so the output equals plain decoding trivially"
    assert s.target_forwards < s.emitted_tokens, f"{label}no fewer target forwards than tokens: {s.as_dict()}"
    for i in range(depth):
        drafted = s.drafted_by_position[i] if i < len(s.drafted_by_position) else 0
        accepted = s.accepted_by_position[i] if i < len(s.accepted_by_position) else 0
        assert drafted > 0 and accepted > 0, (
            f"{label}draft position {i + 1} was never proposed and accepted (drafted {s.drafted_by_position}, "
            f"accepted {s.accepted_by_position})")
    if rejected:
        assert s.accepted_tokens < s.drafted_tokens, f"{label}every draft was accepted: the rejection path never ran"
    for b in range(rows):
        assert b < len(s.accepted_by_row) and s.accepted_by_row[b] > 0, (
            f"{label}batch row {b} never had a draft accepted (accepted by row: {s.accepted_by_row})")
    if row_groups:
        size = len(s.accepted_by_row) // row_groups
        sums = [sum(s.accepted_by_row[g * size : (g + 1) * size]) for g in range(row_groups)]
        assert all(sums), f"{label}a group of batch rows never had a draft accepted (accepted by group: {sums})"
    if uneven:
        assert s.uneven_steps > 0, f"{label}the rows of a batch always accepted the same number of drafts"


class ScriptedCosts(AdaptiveDraftLength):
    """The adaptive policy, fed made-up step costs instead of measured ones: drafting a token costs `draft`, a step
    verifying n tokens `verify + per_token * n` (a GPU-like machine, where drafting pays). Deterministic: the lengths
    it chooses depend on acceptance alone. Records every length it chose in `chosen`."""

    def __init__(self, draft: float = 0.002, verify: float = 0.1, per_token: float = 0.005, **kwargs):
        super().__init__(**kwargs)
        self.costs = (draft, verify, per_token)
        self.chosen: list[int] = []

    def next_length(self) -> int:
        self.chosen.append(super().next_length())
        return self.chosen[-1]

    def record_costs(self, num_drafted, draft_seconds, verify_seconds, num_tried=None):
        draft, verify, per_token = self.costs
        tried = num_drafted if num_tried is None else num_tried
        super().record_costs(num_drafted, draft * tried, verify + per_token * (num_drafted + 1), num_tried=num_tried)


class ScriptedCalibration(CalibratedDraftLength):
    """The calibrated policy, handed made-up costs (as `ScriptedCosts`) instead of measuring the target: drafting
    pays, and the lengths it chooses depend on acceptance alone. Records every length it chose in `chosen`."""

    def __init__(self, draft: float = 0.002, verify: float = 0.1, per_token: float = 0.005, **kwargs):
        super().__init__(**kwargs)
        self.costs = (draft, verify, per_token)
        self.chosen: list[int] = []

    def calibrate(self, model, drafter, batch_size, cap, fast_cpu_verify):
        draft, verify, per_token = self.costs
        self.verify_seconds = self.shape = {n: verify + per_token * n for n in range(1, cap + 2)}
        self.level, self.draft_seconds_per_token = 1.0, draft

    def next_length(self) -> int:
        self.chosen.append(super().next_length())
        return self.chosen[-1]


def assert_adapted(policy: ScriptedCosts) -> None:
    """The adaptive policy drafted on most steps and changed its length at least once."""
    chosen = policy.chosen
    assert chosen, "the policy was never asked for a length"
    drafting = sum(k > 0 for k in chosen)
    assert drafting > 0.5 * len(chosen), f"drafted on only {drafting} of {len(chosen)} steps: {chosen}"
    assert len(set(chosen)) > 1, f"the length never changed: {chosen}"


# --- left-padded batches ----------------------------------------------------------------------------------------------
PAD = 0


def left_pad(prompts):
    """One left-padded batch (ids, attention mask) of 1-row prompts, padded with PAD."""
    width = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), width), PAD)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - p.shape[1] :] = p[0]
        mask[b, width - p.shape[1] :] = 1
    return ids, mask


def check_greedy_prompt_by_prompt(target, drafter, prompts, k: int, depth: int, adaptive_depth: int = 1) -> None:
    """Each prompt decoded with 1 and `k` drafts a step, and adaptively up to `k` (scripted costs), is plain greedy's
    output; drafts were accepted `depth` deep at constant lengths and `adaptive_depth` deep adaptively, and the policy
    changed its length."""
    from hf_specdec import SpeculationStats, speculative_generate

    stats, adaptive, policy = SpeculationStats(), SpeculationStats(), ScriptedCosts()
    for prompt in prompts:
        expected = target.generate(prompt, max_new_tokens=24, do_sample=False)
        for length, draft_length, st in ((1, "constant", stats), (k, "constant", stats), (k, policy, adaptive)):
            out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter,
                                  num_draft_tokens=length, draft_length=draft_length, max_new_tokens=24, do_sample=False,
                                  speculation_stats=st)
            assert torch.equal(out, expected), (length, draft_length)
    assert_speculated(stats, depth=depth)
    assert_speculated(adaptive, depth=adaptive_depth)
    assert_adapted(policy)


def check_greedy_identical(target, drafter, prompts, max_new_tokens: int = 12) -> None:
    """Each prompt decoded with `drafter` (its own default length, constant) is plain greedy's output, and drafts were
    accepted."""
    from hf_specdec import SpeculationStats, speculative_generate

    stats = SpeculationStats()
    for prompt in prompts:
        out = target.generate(prompt, custom_generate=speculative_generate, assistant=drafter,
                              max_new_tokens=max_new_tokens, do_sample=False, speculation_stats=stats,
                              draft_length="constant")
        assert torch.equal(out, target.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False))
    assert_speculated(stats)


def check_greedy_through_enable(target, assistant, prompts, depth: int = 2, max_new_tokens: int = 24) -> None:
    """The other way in: `hf_specdec.enable(target)`, then `generate(assistant=...)`: plain greedy's output on each
    prompt (constant length), drafts accepted `depth` deep."""
    import hf_specdec

    stats = hf_specdec.SpeculationStats()
    hf_specdec.enable(target)
    try:
        for prompt in prompts:
            out = target.generate(prompt, assistant=assistant, max_new_tokens=max_new_tokens, do_sample=False,
                                  speculation_stats=stats, draft_length="constant")
            assert torch.equal(out, target.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False))
    finally:
        hf_specdec.disable(target)
    assert_speculated(stats, depth=depth)


def forwards_beside_transformers(target, prompts, theirs: dict, ours: dict, max_new_tokens: int = 24) -> dict:
    """The target forwards of transformers' own path (`theirs`: its generate() keywords) and of hf_specdec's loop
    (`ours`: speculative_generate's), over `prompts`, each prompt giving both the same tokens."""
    from hf_specdec import speculative_generate
    from hf_specdec.speed.diagnostics import count_forwards

    counts = {"transformers": 0, "hf_specdec": 0}
    for prompt in prompts:
        outputs = {}
        for name, kwargs in (("transformers", theirs), ("hf_specdec", {"custom_generate": speculative_generate, **ours})):
            counts[name] += count_forwards(target, lambda: outputs.__setitem__(name, target.generate(
                prompt, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)))
        assert torch.equal(outputs["hf_specdec"], outputs["transformers"])
    return counts


def check_batches_with_an_early_eos(target, drafter, prompts, lengths, stats, batch_sizes=(2, 6)) -> None:
    """Left-padded batches of the first 2 and 6 prompts, whose last row meets its EOS after 5 tokens, decoded with
    each of `lengths` drafts a step (constant), are plain greedy's output."""
    from hf_specdec import speculative_generate

    for batch_size in batch_sizes:
        ids, mask = left_pad(prompts[:batch_size])
        free = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
        eos = [int(free[-1, ids.shape[1] + 4])]  # the last row stops early
        kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=eos, pad_token_id=PAD)
        expected = target.generate(ids, **kwargs)
        for k in lengths:
            out = target.generate(ids, custom_generate=speculative_generate, assistant=drafter, num_draft_tokens=k,
                                  speculation_stats=stats, **kwargs, draft_length="constant")
            assert torch.equal(out, expected), f"batch={batch_size} k={k}"


# --- drafters that agree with a tiny random target --------------------------------------------------------------------
def quiet_last_layer(target, scale: float = 0.3):
    """Scale down the residual contributions of the target's last decoder layer, so that its first layers predict
    most of what it does (drafters copied from those layers then agree often, but not always)."""
    layer = target.model.layers[-1]
    with torch.no_grad():
        layer.self_attn.o_proj.weight.mul_(scale)
        layer.mlp.down_proj.weight.mul_(scale)
    return target


def agreeing_eagle(target, noise: float = 0.01, seed: int = 0, **config_kwargs) -> SpecDrafterForCausalLM:
    """An EAGLE-style drafter that is the target's first decoder layer (plus its final norm) reading its token
    embeddings, with a little of the target features fused in: on a `quiet_last_layer` target it accepts often at
    every position, and the features still change its drafts. Llama- and Qwen2-style targets (the layer is copied)."""
    biased = target.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2: q/k/v biases, none on o_proj
    config = drafter_config_from_target(target.config, num_hidden_layers=1, target_feature_input=True,
                                        **config_kwargs)
    config.attention_bias = biased
    drafter = SpecDrafterForCausalLM(config).eval()
    hidden = config.hidden_size
    with torch.no_grad():
        layer = drafter.model.layers[0]
        missing = layer.load_state_dict(target.model.layers[0].state_dict(), strict=False).missing_keys
        assert missing == (["self_attn.o_proj.bias"] if biased else []), missing
        if biased:
            layer.self_attn.o_proj.bias.zero_()
        drafter.model.norm.load_state_dict(target.model.norm.state_dict())
        fuse = torch.zeros(hidden, 2 * hidden)
        fuse[:, :hidden] = torch.eye(hidden)
        fuse[:, hidden:] = torch.randn(hidden, hidden, generator=torch.Generator().manual_seed(seed)) * noise
        drafter.model.fuse.weight.copy_(fuse)
    return drafter


@torch.no_grad()
def fitted_heads(target, prompts, num_heads: int = 3, ridge: float = 1e-3, sharpness: float = 8.0,
                 **generate_kwargs) -> MedusaHeads:
    """Medusa heads with LM heads of their own, fitted by least squares to what the target's continuations of
    `prompts` (greedy, 40 tokens, unless `generate_kwargs` say otherwise: fit sampling tests on samples) put
    2.. num_heads + 1 tokens after each hidden state: right often, wrong often. `sharpness` scales the fitted logits,
    so that the heads' sampling distributions are peaked (their argmax does not change)."""
    generate_kwargs = {"do_sample": False, "max_new_tokens": 40, **generate_kwargs}
    features, futures = [], [[] for _ in range(num_heads)]
    for prompt in prompts:
        seq = target.generate(prompt, **generate_kwargs)
        captured = []
        hook = final_norm(target).register_forward_hook(lambda module, args, out: captured.append(out))
        target(seq)
        hook.remove()
        for j in range(seq.shape[1] - 1 - num_heads):  # head i at position j: the token at j + 2 + i
            features.append(captured[0][0, j])
            for i in range(num_heads):
                futures[i].append(int(seq[0, j + 2 + i]))
    x = torch.stack(features)
    config = MedusaConfig.from_target(target.config, num_heads=num_heads, num_layers=0, share_lm_head=False)
    heads = MedusaHeads(config).eval()
    gram = x.T @ x + ridge * torch.eye(x.shape[1])
    for i in range(num_heads):
        onehot = torch.nn.functional.one_hot(torch.tensor(futures[i]), config.vocab_size).float()
        heads.lm_heads[i].weight.copy_(sharpness * torch.linalg.solve(gram, x.T @ onehot).T)
    return heads


@torch.no_grad()
def fitted_eagle3(target, prompts, layer_ids=None, draft_vocab=None, ridge: float = 1e-3, sharpness: float = 8.0,
                  fc_scale: float = 0.5, seed: int = 0, **generate_kwargs) -> Eagle3DraftModel:
    """An EAGLE-3-style drafter with a random layer and a loud `fc` (its drafts depend on the target states it gets),
    whose LM head is fitted by least squares to the token after each position of the target's continuations of
    `prompts` (greedy, 40 tokens unless `generate_kwargs` say otherwise), fed as decoding feeds it: right often, wrong
    often, at the first draft and (less) at the later ones, where it reads its own states. `draft_vocab`: the target
    ids it may propose (default: all)."""
    torch.manual_seed(seed)
    size = 0 if draft_vocab is None else len(draft_vocab)
    config = Eagle3Config.from_target(target.config, draft_vocab_size=size, target_layer_ids=layer_ids, initializer_range=0.3)
    drafter = Eagle3DraftModel(config).eval()  # (a loud layer: what it drafts second differs from what it drafts first)

    def readings(seq, shifted):  # position j reads the state at j - 1 and predicts the token at j + 1
        out = drafter(input_ids=seq, target_features=shifted, use_cache=False).hidden_states[0]
        return drafter.norm(out[0, :-1]), seq[0, 1:]

    return fit_lm_head(drafter, target, prompts, readings, draft_vocab, fc_scale, ridge, sharpness, generate_kwargs)


@torch.no_grad()
def fitted_block(target, prompts, block_size: int = 3, layer_ids=None, draft_vocab=None, ridge: float = 1e-3,
                 sharpness: float = 8.0, fc_scale: float = 0.5, seed: int = 0, **generate_kwargs) -> BlockDrafterModel:
    """A block drafter with a random layer and a loud `fc`, whose LM head is fitted by least squares to the tokens
    1..block_size after each position of the target's continuations of `prompts` (greedy, 40 tokens unless
    `generate_kwargs` say otherwise), each read where decoding reads it (the newest token's position, then the mask
    positions after it): right often, wrong often, at every position of the block."""
    torch.manual_seed(seed)
    size = 0 if draft_vocab is None else len(draft_vocab)
    config = BlockDrafterConfig.from_target(target.config, draft_vocab_size=size, target_layer_ids=layer_ids,
                                            block_size=block_size, initializer_range=0.3)
    drafter = BlockDrafterModel(config).eval()

    def readings(seq, shifted):  # every position as the newest token, its block's masks after it
        out, predicts = drafter.forward_blocks(seq, shifted, torch.arange(seq.shape[1] - 1)[None])
        keep = predicts[0] < seq.shape[1] - 1  # the token it predicts is in the sequence
        return drafter.norm(out.hidden_states[0][0, keep]), seq[0, predicts[0, keep] + 1]

    return fit_lm_head(drafter, target, prompts, readings, draft_vocab, fc_scale, ridge, sharpness, generate_kwargs)


def fit_lm_head(drafter, target, prompts, readings, draft_vocab, fc_scale: float, ridge: float, sharpness: float,
                generate_kwargs: dict):
    """Bind `drafter` (a fused-states drafter), make its `fc` loud, and fit its LM head by least squares to what
    `readings(seq, shifted fused states)` pairs: its normed outputs and the target tokens they should predict, over
    the target's continuations of `prompts`."""
    generate_kwargs = {"do_sample": False, "max_new_tokens": 40, **generate_kwargs}
    if draft_vocab is not None:
        drafter.set_draft_vocab(draft_vocab)
    drafter.fc.weight.normal_(0, fc_scale)
    drafter.bind_target(target)
    modules = entering_layers(target, drafter.config.target_layer_ids)
    inputs, nexts = [], []
    for prompt in prompts:
        seq = target.generate(prompt, **generate_kwargs)
        captured = [None] * len(modules)
        hooks = [m.register_forward_hook(lambda mod, a, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out))
                 for i, m in enumerate(modules)]
        target(seq)
        for hook in hooks:
            hook.remove()
        states = drafter.fuse(torch.cat(captured, dim=-1))
        shifted = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], dim=1)  # position j reads the state at j - 1
        x, y = readings(seq, shifted)
        inputs.append(x)
        nexts.append(y)
    x = torch.cat(inputs)
    onehot = torch.nn.functional.one_hot(torch.cat(nexts), drafter.config.vocab_size).float()[:, drafter.draft_vocab]
    gram = x.T @ x + ridge * torch.eye(x.shape[1])
    drafter.lm_head.weight.copy_(sharpness * torch.linalg.solve(gram, x.T @ onehot).T)
    return drafter


class TargetOracleDrafter(CrossTokenizerDrafter):
    """Replaces the draft model by the target's own greedy continuation, seen only through text and the draft
    tokenizer: a near-perfect drafter, so a high acceptance tests the text alignment in both directions."""

    def __init__(self, target, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.oracle = target

    def _draft_tokens(self, draft_ids, num):
        text = self.draft_tokenizer.decode(draft_ids)
        ids = torch.tensor([self.target_tokenizer(text, add_special_tokens=False)["input_ids"]])
        out = self.oracle.generate(ids, max_new_tokens=num + 2, do_sample=False)[0].tolist()
        continuation = self.target_tokenizer.decode(out)[len(self.target_tokenizer.decode(ids[0].tolist())) :]
        return self.draft_tokenizer(continuation, add_special_tokens=False)["input_ids"][:num], False


# --- drafters that record what they are handed ------------------------------------------------------------------------
class RecordingEagle(EagleDrafter):
    """Keeps each row's features when it leaves the batch, by its original row index."""

    def start(self, *args, **kwargs):
        super().start(*args, **kwargs)
        self.row_ids, self.final = list(range(len(self.features))), {}

    def select_rows(self, rows):
        for b, original in enumerate(self.row_ids):
            self.final[original] = self.features[b]
        self.row_ids = [self.row_ids[b] for b in rows]
        super().select_rows(rows)


def lie_about_second_q(drafter):
    """A negative control: `drafter` now reports its FIRST draft's distribution for its second draft as well, so that
    a rule trusting the reported q accepts second drafts with the wrong probability (nothing else changes)."""
    propose = drafter.propose

    def lying(*args, **kwargs):
        draft = propose(*args, **kwargs)
        if draft.probs is not None and draft.num_tokens >= 2:
            draft.probs = torch.cat([draft.probs[:, :1], draft.probs[:, :1], draft.probs[:, 2:]], dim=1)
        return draft

    drafter.propose = lying
    return drafter


__all__ = ["check_greedy_through_enable", "forwards_beside_transformers", "assert_speculated", "ScriptedCosts", "assert_adapted", "PAD", "left_pad", "quiet_last_layer",
           "agreeing_eagle", "fitted_heads", "fitted_eagle3", "fitted_block", "TargetOracleDrafter", "RecordingEagle",
           "lie_about_second_q"]
