"""LAB SHIM, not Moonshot's file. moonshotai/Kimi-K2.5's config.json names remote code
(auto_map AutoConfig -> configuration_kimi_k25.KimiK25Config), and the recipe passes
--trust-remote-code, so transformers' AutoConfig imports this module from the model
directory before SGLang sees the config. The published configuration_kimi_k25.py could not
be fetched here (no Hugging Face access); this shim re-exports the KimiK25Config that the
pinned SGLang (0.5.23) ships in sglang/srt/configs/kimi_k25.py, the class SGLang itself
re-loads every kimi_k25 config with (its _CONFIG_REGISTRY), so argument resolution sees
the same object it would see with the real file. Replace it with the published file when
the lab can fetch it; never copy it into a real weights directory.
"""

from sglang.srt.configs.kimi_k25 import KimiK25Config, KimiK25VisionConfig  # noqa: F401

__all__ = ["KimiK25Config", "KimiK25VisionConfig"]
