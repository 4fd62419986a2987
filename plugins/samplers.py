"""The first-party batch samplers, `"bucket"` and `"max_tokens"`, by their old path.

They live in `framework.data.sampler` (import them from `framework.data`);
`framework_plugins.builtin:samplers` registers them through the plugin hook.
"""

from __future__ import annotations

from framework.data.sampler import BucketBatchSampler, MaxTokensBatchSampler, add_noise

__all__ = ["BucketBatchSampler", "MaxTokensBatchSampler", "add_noise"]
