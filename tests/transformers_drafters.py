"""Tiny random instances of the drafters transformers ships (MTP layers, DFlash block drafters, Gemma 4 assistants),
built the way transformers loads them, and tuned so that a tiny random target accepts their drafts often but not
always (else "identical to plain generate()" would hold trivially)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

_RESIDUAL_OUTPUTS = ("o_proj.weight", "down_proj.weight", "down_proj")  # what a layer adds to the residual stream


def _scale_residual_outputs(module, scale: float) -> None:
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if name.endswith(_RESIDUAL_OUTPUTS):
                parameter.mul_(scale)


def tiny_deepseek_with_mtp(folder, vocab: int = 32, seed: int = 0, quiet: float = 0.05) -> DeepseekV3ForCausalLM:
    """A 2-layer DeepSeek-V3 (MLA attention, MoE) saved in `folder` with one MTP layer in its checkpoint, as DeepSeek
    ships them (`model.layers.2.*`, per-expert weights), loaded back. Its layers are quieted (`quiet`), so that its next
    token depends mostly on the current one; the MTP layer passes its token's embedding through (its projection reads
    the embedding, its block is quieted too), so that it predicts what the target would say after that token: right
    often, not always."""
    from transformers.modeling_layers import MtpModel

    torch.manual_seed(seed)
    config = DeepseekV3Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4, kv_lora_rank=16,
        q_lora_rank=16, qk_rope_head_dim=8, v_head_dim=8, qk_nope_head_dim=8, n_group=1, topk_group=1,
        num_experts_per_tok=2, first_k_dense_replace=1, num_mtp_layers=1, max_position_embeddings=256,
        pad_token_id=0, eos_token_id=None, bos_token_id=None, initializer_range=0.3)
    target = DeepseekV3ForCausalLM(config).eval()
    _scale_residual_outputs(target, quiet)
    mtp = MtpModel(target, 1)
    layer, hidden = mtp.layers[0], config.hidden_size
    with torch.no_grad():
        for name, parameter in layer.named_parameters():  # (MtpModel leaves its block's experts uninitialised)
            parameter.copy_(torch.ones_like(parameter) if parameter.dim() == 1 else 0.3 * torch.randn_like(parameter))
        layer.mtp_block.mlp.gate.e_score_correction_bias.zero_()
        layer.eh_proj.weight.zero_()
        layer.eh_proj.weight[:, :hidden] = torch.eye(hidden)
        layer.eh_proj.weight[:, hidden:] = 0.02 * torch.randn(hidden, hidden)  # the target's state matters a little
    _scale_residual_outputs(layer.mtp_block, 0.0)
    target.save_pretrained(folder)
    path = Path(folder) / "model.safetensors"
    tensors = load_file(path)
    tensors.update(_checkpoint_keys(mtp.state_dict(), f"model.layers.{config.num_hidden_layers}."))
    save_file(tensors, path, metadata={"format": "pt"})
    loaded = DeepseekV3ForCausalLM.from_pretrained(folder).eval()
    # transformers finds MTP weights by the layer number DeepSeek-V3 ships (61); this checkpoint has 2 layers
    loaded._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{config.num_hidden_layers}\..*"]
    return loaded


def _checkpoint_keys(state: dict, prefix: str) -> dict:
    """An MtpModel's weights under the names DeepSeek's checkpoints give them (the layer after the last, its experts
    one by one); the embeddings and head are the target's."""
    out = {}
    for key, value in state.items():
        if key.startswith(("embed_tokens", "shared_head")):
            continue
        key = (key.replace("layers.0.mtp_block.", prefix).replace("layers.0.post_norm.", f"{prefix}shared_head.norm.")
               .replace("layers.0.", prefix))
        if key.endswith("mlp.experts.gate_up_proj"):
            for e, weight in enumerate(value):
                gate, up = weight.chunk(2, dim=0)
                out[f"{key[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = gate.contiguous()
                out[f"{key[:-len('gate_up_proj')]}{e}.up_proj.weight"] = up.contiguous()
        elif key.endswith("mlp.experts.down_proj"):
            for e, weight in enumerate(value):
                out[f"{key[:-len('down_proj')]}{e}.down_proj.weight"] = weight.contiguous()
        else:
            out[key] = value.contiguous()
    return out


def trained_dflash(target, prompts, block_size: int = 4, target_layers: str = "0,1", layers: int = 1, steps: int = 150,
                   seed: int = 0, **generate_kwargs):
    """A tiny DFlash drafter trained for `steps` on the target's continuations of `prompts` (greedy, 40 tokens, unless
    `generate_kwargs` say otherwise: fit sampling tests on samples; every position an anchor, cross-entropy on the
    target's tokens): its first block slots agree with the target often, not always. One layer learns to tell its mask
    slots apart only where the greedy text makes it easy; sampling tests take two."""
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantModel

    from hf_specdec.kinds.dflash.drafter import context_modules
    from hf_specdec.training.states import target_states
    from hf_specdec.kinds.dflash.options import DFlashOptions
    from hf_specdec.kinds.dflash.training import block_hidden, new_config

    torch.manual_seed(seed)
    options = DFlashOptions(block_size=block_size, target_layer_ids=target_layers, num_hidden_layers=layers)
    model = MuseGlimmerAssistantModel(new_config(target.config, options))
    with torch.no_grad():  # loud attention (transformers' 0.02 init): the block's slots tell their positions apart
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.3)
    modules = context_modules(target, model.config.target_layer_ids)
    data = []
    with torch.no_grad():
        for prompt in prompts:
            seq = target.generate(prompt, **{"do_sample": False, "max_new_tokens": 40, **generate_kwargs})
            data.append((seq, target_states(target, seq, modules)))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    embedding, head = target.get_input_embeddings(), target.get_output_embeddings()
    for _ in range(steps):
        loss = 0
        for seq, features in data:
            anchors = torch.arange(1, seq.shape[1] - 1)[None]
            logits = head(block_hidden(model, features, seq, anchors, embedding)[:, :, 1:])  # [1, A, size - 1, V]
            wanted = anchors[:, :, None] + torch.arange(1, block_size)  # slot i: the token j + i
            keep = wanted < seq.shape[1]
            loss = loss + torch.nn.functional.cross_entropy(logits[keep], seq[0, wanted[keep]])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def tiny_gemma4_with_assistant(vocab: int = 16, seed: int = 0, quiet: float = 0.05, noise: float = 0.02,
                               num_assistant_tokens: int = 4, sliding_window: int = 64):
    """A 2-layer Gemma 4 target (a sliding and a full layer, both storing the K/V an assistant reads) and a Gemma 4
    assistant that agrees with it often, not always: the target's layers are quieted (their post-norms scaled by
    `quiet`), so that its next token depends mostly on the current one; the assistant passes its token's embedding
    through (its projection reads the embedding, a little of the target's state; its layers are silenced) to the
    target's own final norm and LM head."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    from transformers.models.gemma4_assistant import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    torch.manual_seed(seed)
    shape = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 layer_types=["sliding_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1,
                 head_dim=16, global_head_dim=16, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
                 sliding_window=sliding_window, max_position_embeddings=256, pad_token_id=0, eos_token_id=None, bos_token_id=None,
                 initializer_range=0.3, tie_word_embeddings=False)
    target = Gemma4ForCausalLM(Gemma4TextConfig(**shape)).eval()
    assistant = Gemma4AssistantForCausalLM(Gemma4AssistantConfig(
        text_config=dict(model_type="gemma4_text", **shape), backbone_hidden_size=32, tie_word_embeddings=False)).eval()
    hidden = shape["hidden_size"]
    with torch.no_grad():
        for layer in target.model.layers:
            layer.post_attention_layernorm.weight.mul_(quiet)
            layer.post_feedforward_layernorm.weight.mul_(quiet)
        for layer in assistant.model.layers:
            layer.post_attention_layernorm.weight.zero_()
            layer.post_feedforward_layernorm.weight.zero_()
        assistant.pre_projection.weight.zero_()
        assistant.pre_projection.weight[:, :hidden] = torch.eye(hidden)
        assistant.pre_projection.weight[:, hidden:] = noise * torch.randn(hidden, hidden)  # the target's state matters a little
        assistant.post_projection.weight.copy_(torch.eye(hidden))
        assistant.model.norm.weight.copy_(target.model.norm.weight)
        assistant.lm_head.weight.copy_(target.lm_head.weight)
    assistant.generation_config.num_assistant_tokens = num_assistant_tokens
    return target, assistant


__all__ = ["tiny_deepseek_with_mtp", "trained_dflash", "tiny_gemma4_with_assistant"]
