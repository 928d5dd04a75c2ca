"""Writes the published-format fixtures with the other projects' own code: each a tiny drafter saved the way its
project saves it, and that project's own outputs for fixed inputs (reference.safetensors), which
tests/test_published.py compares hf_specdec's reading with. It also loads hf_specdec's exports with the peers' code
and records what they compute (`exports/`).

Run it in the peers' environment, not the project's (their pins clash with it): `tests/published/make_fixtures.sh`.
Every tensor is random (seeded); the shapes fit the tests' tiny Llama target (hidden 48, 96 tokens, 4 heads of 12, 2
KV heads, 4 layers).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # (speculators looks the verifier up; the fixtures name a made-up one)

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT = HERE / "fixtures"
H, V, HEADS, KV, HEAD_DIM, INTER = 48, 96, 4, 2, 12, 96
L = 12  # positions in each reference input


def randomized(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter random (norm weights around 1, so that they matter; the peers' NaN sentinels replaced)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module.eval()


def saved(model, folder: Path) -> None:
    """The peer's own save_pretrained, less the copy of its config class's source it leaves beside the config
    (`auto_map`): the project never runs a checkpoint's code, and keeps no copy of theirs."""
    model.save_pretrained(folder)
    for source in folder.glob("*.py"):
        source.unlink()


def reference(folder: Path, **tensors) -> None:
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(folder / "reference.safetensors"))


class Captured(Exception):
    pass


# --- speculators (vllm-project/speculators 0.9) ----------------------------------------------------------------------
def speculators_eagle3(name: str, *, seed: int, qwen3=False, draft_vocab=V, layer_ids=(1, 2, 4), layers=1, window=None,
                       steps=3, **flags) -> None:
    from transformers import LlamaConfig, Qwen3Config
    from speculators import Eagle3DraftModel, Eagle3SpeculatorConfig, SpeculatorsConfig, VerifierConfig
    from speculators.proposals import GreedyTokenProposalConfig

    shape = dict(vocab_size=V, hidden_size=H, intermediate_size=INTER, num_hidden_layers=layers,
                 num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HEAD_DIM, rms_norm_eps=1e-6,
                 max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                 tie_word_embeddings=False)
    if window:
        shape.update(sliding_window=window, layer_types=["sliding_attention"] * layers)
    layer = (Qwen3Config if qwen3 else LlamaConfig)(**shape)
    layer._attn_implementation = "eager"
    spec = SpeculatorsConfig(algorithm="eagle3", default_proposal_method="greedy",
                             proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=steps)],
                             verifier=VerifierConfig(name_or_path="tiny/llama-4-layers", architectures=["LlamaForCausalLM"]))
    config = Eagle3SpeculatorConfig(transformer_layer_config=layer, draft_vocab_size=draft_vocab,
                                    eagle_aux_hidden_state_layer_ids=list(layer_ids), speculators_config=spec, **flags)
    model = randomized(Eagle3DraftModel(config), seed)
    if draft_vocab < V:
        g = torch.Generator().manual_seed(seed + 1)
        kept = torch.randperm(V, generator=g)[:draft_vocab].sort().values
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[kept] = True
        model.load_vocab_mappings(t2d, kept - torch.arange(draft_vocab))
    folder = OUT / name
    saved(model, folder)
    g = torch.Generator().manual_seed(seed + 2)
    states = torch.randn(1, L, len(layer_ids) * H, generator=g)
    ids = torch.randint(0, V, (1, L), generator=g)
    logits = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: logits.append(out))
    with torch.no_grad():
        model(hidden_states=states, input_ids=ids, document_ids=torch.zeros(1, L, dtype=torch.long), ttt_steps=steps)
    hook.remove()
    # row t of step k: the token ids[t + k] with step k - 1's output at row t fed back (teacher-forced: what drafting
    # those tokens feeds), i.e. the (k + 1)-th draft after the pair (ids[t], states[t])
    reference(folder, states=states, input_ids=ids, step_logits=torch.cat(logits))


def speculators_peagle(name: str, *, seed: int, depths=4, layer_ids=(1, 2, 4), **flags) -> None:
    from transformers import LlamaConfig
    from speculators import PEagleDraftModel, PEagleSpeculatorConfig, SpeculatorsConfig, VerifierConfig
    from speculators.proposals import GreedyTokenProposalConfig
    import speculators.models.peagle.core as peagle

    layer = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=INTER, num_hidden_layers=1,
                        num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HEAD_DIM, rms_norm_eps=1e-6,
                        max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        tie_word_embeddings=False)
    layer._attn_implementation = "eager"
    spec = SpeculatorsConfig(algorithm="peagle", default_proposal_method="greedy",
                             proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=depths)],
                             verifier=VerifierConfig(name_or_path="tiny/llama-4-layers", architectures=["LlamaForCausalLM"]))
    config = PEagleSpeculatorConfig(transformer_layer_config=layer, draft_vocab_size=V, mask_token_id=V - 1,
                                    eagle_aux_hidden_state_layer_ids=list(layer_ids), speculators_config=spec, **flags)
    model = randomized(PEagleDraftModel(config), seed)
    folder = OUT / name
    saved(model, folder)
    g = torch.Generator().manual_seed(seed + 2)
    states = torch.randn(1, L, len(layer_ids) * H, generator=g)
    ids = torch.randint(0, V, (1, L), generator=g)
    anchor = 6  # every row at depth 0, then the block after row 6: depths 1..depths-1
    anchors = torch.cat([torch.arange(L), torch.full((depths - 1,), anchor)])
    depth = torch.cat([torch.zeros(L, dtype=torch.long), torch.arange(1, depths)])
    peagle.generate_cod_sample_indices = lambda **kwargs: (anchors, depth)
    logits = []

    def capture(module, args, out):
        logits.append(out)
        raise Captured

    hook = model.lm_head.register_forward_hook(capture)
    try:
        with torch.no_grad():
            model(hidden_states=states, input_ids=ids, document_ids=torch.zeros(1, L, dtype=torch.long),
                  verifier_last_hidden_states=torch.zeros(1, L, H), num_depths=depths)
    except Captured:
        pass
    hook.remove()
    # logits[0][0, :L]: each row's first draft; [0, L:]: the block after row `anchor`, drafts 2..depths
    reference(folder, states=states, input_ids=ids, logits=logits[0][0], anchor=torch.tensor(anchor))


def speculators_dflash(name: str, *, seed: int, block=4, layer_ids=(1, 3), anchor=6) -> None:
    from transformers import Qwen3Config
    from speculators import DFlashDraftModel, DFlashSpeculatorConfig, SpeculatorsConfig, VerifierConfig
    from speculators.proposals import GreedyTokenProposalConfig

    layer = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=INTER, num_hidden_layers=2,
                        num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HEAD_DIM, rms_norm_eps=1e-6,
                        max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    layer._attn_implementation = "eager"
    spec = SpeculatorsConfig(algorithm="dflash", default_proposal_method="greedy",
                             proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=block - 1)],
                             verifier=VerifierConfig(name_or_path="tiny/llama-4-layers", architectures=["LlamaForCausalLM"]))
    config = DFlashSpeculatorConfig(transformer_layer_config=layer, draft_vocab_size=V, block_size=block,
                                    aux_hidden_state_layer_ids=list(layer_ids), mask_token_id=V - 1,
                                    speculators_config=spec)
    model = randomized(DFlashDraftModel(config), seed)  # (its embeddings and LM head: the target's, set here)
    folder = OUT / name
    saved(model, folder)
    g = torch.Generator().manual_seed(seed + 2)
    states = torch.randn(1, L, len(layer_ids) * H, generator=g)
    ids = torch.randint(0, V, (1, L), generator=g)
    loss_mask = torch.zeros(1, L)
    loss_mask[0, anchor] = 1  # one block, after row `anchor`: its context is rows < anchor
    with torch.no_grad():
        _, logits, *_ = model._backbone_forward(states, ids, loss_mask, torch.zeros(1, L, H),
                                                torch.zeros(1, L, dtype=torch.long), max_anchors=1)
    reference(folder, states=states, input_ids=ids, logits=logits[0], anchor=torch.tensor(anchor),
              target_embeddings=model.embed_tokens.weight, lm_head=model.lm_head.weight)


# --- SpecForge 0.2 (LlamaForCausalLMEagle3: SafeAILab's names, which vLLM and SGLang read) ------------------------------
def specforge_eagle3(name: str, *, seed: int, draft_vocab=64, with_embeddings=True, safeailab_files=False, **flags):
    from transformers import LlamaConfig
    import specforge.modeling.draft.llama3_eagle as sf

    config = LlamaConfig(architectures=["LlamaForCausalLMEagle3"], vocab_size=V, draft_vocab_size=draft_vocab,
                         hidden_size=H, intermediate_size=INTER, num_hidden_layers=1, num_attention_heads=HEADS,
                         num_key_value_heads=KV, head_dim=HEAD_DIM, max_position_embeddings=256, rms_norm_eps=1e-5,
                         pad_token_id=0, tie_word_embeddings=False, **flags)
    model = randomized(sf.LlamaForCausalLMEagle3(config), seed)
    g = torch.Generator().manual_seed(seed + 1)
    kept = torch.randperm(V, generator=g)[:draft_vocab].sort().values
    with torch.no_grad():
        model.d2t.copy_(kept - torch.arange(draft_vocab))
        model.t2d.zero_()
        model.t2d[kept] = True
    folder = OUT / name
    if safeailab_files:  # SafeAILab's EAGLE-3 release: the state dict without the frozen embeddings, pickled
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v for k, v in model.state_dict().items() if k != "embed_tokens.weight"}
        torch.save(state, folder / "pytorch_model.bin")
        saved = {k: v for k, v in config.to_dict().items() if k not in ("transformers_version",)}
        saved["architectures"] = ["LlamaForCausalLM"]
        (folder / "config.json").write_text(json.dumps(saved, indent=2))
    else:
        model.save_pretrained(folder)
        if not with_embeddings:  # SpecForge's SGLang export: every embedding dropped
            from safetensors.torch import load_file

            state = {k: v for k, v in load_file(folder / "model.safetensors").items() if "embed" not in k}
            save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    g = torch.Generator().manual_seed(seed + 2)
    states = torch.randn(1, L, 3 * H, generator=g)
    ids = torch.randint(0, V, (1, L), generator=g)
    target_embeddings = torch.randn(V, H, generator=g) * 0.3  # the target's, where the file has none
    with torch.no_grad():
        if not with_embeddings or safeailab_files:
            model.embed_tokens.weight.copy_(target_embeddings)
        mask = sf.prepare_decoder_attention_mask(torch.ones(1, L, dtype=torch.bool), (1, L), states, 0)
        out = model.backbone(model.embed_input_ids(ids), model.project_hidden_states(states), None, mask,
                             torch.arange(L)[None], use_cache=False)
        logits = model.compute_logits(out)[0]
    reference(folder, states=states, input_ids=ids, logits=logits, target_embeddings=target_embeddings)


# --- SafeAILab EAGLE-1 (eagle-llm 1.2.1) --------------------------------------------------------------------------------
def eagle1(name: str, *, seed: int, bias=True, layers=1) -> None:
    from eagle.model.cnets import Model
    from eagle.model.configs import EConfig

    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    saved = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=V, hidden_size=H,
                 intermediate_size=INTER, num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=KV,
                 max_position_embeddings=256, rms_norm_eps=1e-6, pad_token_id=0, hidden_act="silu", bias=bias)
    (folder / "config.json").write_text(json.dumps(saved, indent=2))
    config = EConfig.from_pretrained(str(folder / "config.json"))
    config.rope_scaling = None  # (transformers 5 reads rope_scaling as rope_parameters: eagle-llm then fails)
    model = randomized(Model(config, bias=bias), seed)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")  # what its trainer's accelerator.save_state wrote
    g = torch.Generator().manual_seed(seed + 2)
    features = torch.randn(1, L, H, generator=g)  # the target's final (normed) states f_0..f_{L-1}
    ids = torch.randint(0, V, (1, L + 1), generator=g)  # x_0..x_L: row j pairs x_{j+1} with f_j
    head = torch.randn(V, H, generator=g) * 0.3  # the target's LM head (EAGLE-1 drafts through it)
    with torch.no_grad():
        out, kv = model(features, input_ids=ids[:, 1:], use_cache=True)
        logits = out @ head.T
        chain, fed, tokens = [], out[:, -1:], []
        for _ in range(3):  # its own greedy chain: the output fed back with the token it drafted
            token = (fed @ head.T).argmax(-1)
            tokens.append(token)
            fed, kv = model(fed, input_ids=token, past_key_values=kv, use_cache=True)
            chain.append(fed @ head.T)
    reference(folder, features=features, input_ids=ids, lm_head=head, logits=logits[0],
              chain_tokens=torch.cat(tokens, 1)[0], chain_logits=torch.cat(chain, 1)[0])


# --- FasterDecoding Medusa (medusa-llm 0.1) ---------------------------------------------------------------------------
def medusa(name: str, *, seed: int, heads=3, layers=1, full_model=False) -> None:
    import medusa.model.medusa_model as mm
    from transformers import LlamaConfig, LlamaForCausalLM

    mm.AutoTokenizer.from_pretrained = staticmethod(lambda *a, **k: None)  # (its constructor loads a tokenizer)
    torch.manual_seed(seed)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=INTER, num_hidden_layers=2,
                                        num_attention_heads=HEADS, num_key_value_heads=KV))
    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    model = mm.MedusaModel(base, medusa_num_heads=heads, medusa_num_layers=layers, base_model_name_or_path="tiny/llama")
    randomized(model.medusa_head, seed)
    if full_model:  # Medusa-2: the whole (fine-tuned) model, its heads as `medusa_head.*`
        state = {**base.state_dict(), **{f"medusa_head.{k}": v for k, v in model.medusa_head.state_dict().items()}}
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})
        saved = {**base.config.to_dict(), "medusa_num_heads": heads, "medusa_num_layers": layers}
        (folder / "config.json").write_text(json.dumps(saved, indent=2))
    else:  # Medusa-1: the heads alone, and its MedusaConfig
        torch.save(model.medusa_head.state_dict(), folder / "medusa_lm_head.pt")
        mm.MedusaConfig(medusa_num_heads=heads, medusa_num_layers=layers,
                        base_model_name_or_path="tiny/llama").save_pretrained(folder)
    g = torch.Generator().manual_seed(seed + 2)
    hidden = torch.randn(1, L, H, generator=g)
    with torch.no_grad():
        logits = torch.stack([model.medusa_head[i](hidden)[0] for i in range(heads)])  # head i: token i + 2 ahead
    reference(folder, hidden=hidden, logits=logits)


# --- hf_specdec's exports, read by the peers' code -------------------------------------------------------------------
def read_exports() -> None:
    """Each export tests/published/exports/ holds (written by hf_specdec), loaded with the peer that reads its layout,
    and what that peer computes for the inputs beside it."""
    exports = HERE / "exports"
    speculators_folder = exports / "speculators-eagle3"
    if speculators_folder.is_dir():
        from speculators import Eagle3DraftModel
        from safetensors.torch import load_file

        os.chdir(HERE)  # (its verifier, exports/verifier, is named relative to here)
        model = Eagle3DraftModel.from_pretrained(speculators_folder, attn_implementation="eager").eval()
        inputs = load_file(exports / "inputs.safetensors")
        logits = []
        hook = model.lm_head.register_forward_hook(lambda module, args, out: logits.append(out))
        with torch.no_grad():
            model(hidden_states=inputs["states"], input_ids=inputs["input_ids"],
                  document_ids=torch.zeros_like(inputs["input_ids"]), ttt_steps=1)
        hook.remove()
        save_file({"logits": logits[0][0].contiguous()}, str(speculators_folder / "peer_logits.safetensors"))
    llama_folder = exports / "vllm-eagle3"
    if llama_folder.is_dir():
        from transformers import LlamaConfig
        from safetensors.torch import load_file
        import specforge.modeling.draft.llama3_eagle as sf

        model = sf.LlamaForCausalLMEagle3(LlamaConfig.from_pretrained(llama_folder)).eval()
        inputs = load_file(exports / "inputs.safetensors")
        state = load_file(llama_folder / "model.safetensors")
        state["embed_tokens.weight"] = inputs["target_embeddings"]  # the engines share the target's
        model.load_state_dict(state, strict=True)  # (every tensor of the layout, none left over)
        states, ids = inputs["states"], inputs["input_ids"]
        with torch.no_grad():
            mask = sf.prepare_decoder_attention_mask(torch.ones(ids.shape, dtype=torch.bool), ids.shape, states, 0)
            out = model.backbone(model.embed_input_ids(ids), model.project_hidden_states(states), None, mask,
                                 torch.arange(ids.shape[1])[None], use_cache=False)
            logits = model.compute_logits(out)[0]
        save_file({"logits": logits.contiguous()}, str(llama_folder / "peer_logits.safetensors"))


def main() -> None:
    torch.set_grad_enabled(False)
    speculators_eagle3("speculators-eagle3", seed=1, draft_vocab=64, window=8, norm_before_fc=True, norm_output=True)
    speculators_eagle3("speculators-eagle3-qwen3", seed=2, qwen3=True, layers=2, layer_ids=(0, 2, 3, 4), fc_norm=True,
                       norm_before_residual=True)
    speculators_peagle("speculators-peagle", seed=3, norm_before_fc=True)
    speculators_dflash("speculators-dflash", seed=11)
    specforge_eagle3("specforge-eagle3", seed=4, fc_norm=True)
    specforge_eagle3("specforge-eagle3-sglang", seed=5, with_embeddings=False, norm_output=False)
    specforge_eagle3("safeailab-eagle3", seed=6, safeailab_files=True)
    eagle1("safeailab-eagle1", seed=7, bias=True)
    eagle1("safeailab-eagle1-2layers", seed=8, bias=False, layers=2)
    medusa("medusa1", seed=9, heads=3)
    medusa("medusa2", seed=10, heads=2, full_model=True)
    read_exports()


if __name__ == "__main__":
    main()
