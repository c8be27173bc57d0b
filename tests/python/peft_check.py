"""PEFT's reading of an adapters export: adapter_config.json beside the adapters file, and the
model PEFT would make of it, by a plain reading of PEFT's LoRA (peft.tuners.lora): a module is
adapted when its name equals a target_modules entry or ends with "." + one; its weight becomes
W + (lora_alpha / r)·B·A, transposed where fan_in_fan_out (GPT-2's Conv1D, stored input ×
output). Shared by test_lora.py (GPT-2) and test_llama_lora.py (Llama).
"""
import json
import os

import numpy as np

PEFT_PREFIX = "base_model.model."


def adapted(module, targets):
    return any(module == t or module.endswith("." + t) for t in targets)


def peft_merge(config_path, adapters, base):
    """The base's tensors ({HF name: array}) with the adapters merged as PEFT would, reading
    the rank, alpha, targets and layout from the config alone. Returns (merged, config,
    problems): problems lists the adapted linears without adapters and the adapters of no
    adapted linear."""
    with open(config_path) as f:
        config = json.load(f)
    scale = config["lora_alpha"] / config["r"]
    merged, problems = dict(base), []
    linears = [n[:-len(".weight")] for n in base if n.endswith(".weight") and base[n].ndim == 2]
    for module in linears:
        a = adapters.pop(PEFT_PREFIX + module + ".lora_A.weight", None)
        b = adapters.pop(PEFT_PREFIX + module + ".lora_B.weight", None)
        if not adapted(module, config["target_modules"]):
            if a is not None or b is not None:
                problems.append(f"adapters of {module}, which target_modules leave out")
            continue
        if a is None or b is None:
            problems.append(f"{module} is adapted but has no lora_A/lora_B")
            continue
        delta = scale * (b.astype(np.float64) @ a.astype(np.float64))
        delta = delta.T if config["fan_in_fan_out"] else delta
        if delta.shape != base[module + ".weight"].shape:
            problems.append(f"{module}: B·A is {delta.shape}, the weight "
                            f"{base[module + '.weight'].shape} (fan_in_fan_out?)")
            continue
        merged[module + ".weight"] = base[module + ".weight"] + delta
    problems += [f"{n} belongs to no linear of the base" for n in adapters]
    return merged, config, problems


def check_peft_export(check, common, adapters_file, base_file, merged_file, rank, alpha,
                      fan_in_fan_out):
    """adapter_config.json beside `adapters_file` says what was trained, and PEFT's merge from
    it equals Trident's --merge-lora export within 1e-6."""
    config_path = os.path.join(os.path.dirname(adapters_file), "adapter_config.json")
    adapters, _ = common.read_safetensors(adapters_file)
    base, _ = common.read_safetensors(base_file)
    merged, config, problems = peft_merge(config_path, adapters, base)
    check(config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
          and config["r"] == rank and config["lora_alpha"] == alpha
          and config["fan_in_fan_out"] is fan_in_fan_out
          and os.path.samefile(config["base_model_name_or_path"], base_file),
          f"adapter_config.json: {config}")
    ours, _ = common.read_safetensors(merged_file)
    worst = max((common.relative_error(ours[n], merged[n]), n) for n in ours)
    check(not problems and sorted(ours) == sorted(merged) and worst[0] <= 1e-6,
          f"PEFT's merge from adapter_config.json is --merge-lora's (worst {worst[0]:.2e}, "
          f"{worst[1]}; {problems[:3]})")
