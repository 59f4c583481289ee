"""The server's parallel layout, read from its ``server_args`` line, and the global rank of a line under it.

Which rank a line belongs to is the log core's one rank rule (`sessions.logs.lines`): it gives the line's
tag, ``(("PP", 1), ("TP", 2))`` say.  This module only places that tag in the layout: with ``pp_size`` and
plain data parallelism (DP replicas, each its own TP group) a tag names global rank
``tp + pp * tp_size + dp * tp_size * pp_size``; under DP attention ``DPn`` sits inside the TP group and
adds nothing.  torch's ``[rankN]:`` is a global rank already.
"""

from __future__ import annotations

import re

from sessions.logs.lines import TORCH_RANK, Tag

# The keys the tracker keeps from the server_args line (the layout, and what hints and the diagnosis read).
SERVER_ARGS_KEYS = (
    "tp_size", "pp_size", "dp_size", "ep_size", "nnodes", "node_rank", "enable_dp_attention", "attn_dp_size",
    "attn_tp_size",
    "attention_backend", "prefill_attention_backend", "decode_attention_backend", "disable_cuda_graph",
    "enable_torch_compile", "disable_custom_all_reduce", "mem_fraction_static", "cuda_graph_max_bs",
    "watchdog_timeout", "dist_timeout", "moe_a2a_backend", "deepep_mode", "enable_deepep_moe", "model_path",
    "host", "port", "speculative_algorithm", "enable_return_aux_hidden_states", "skip_server_warmup",
    "load_format", "kv_cache_dtype", "quantization", "dist_init_addr", "chunked_prefill_size",
    "disable_radix_cache", "enable_p2p_check",
)
SERVER_ARG_RE = re.compile(
    r"(?<![\w])['\"]?(?P<key>" + "|".join(SERVER_ARGS_KEYS) + r")['\"]?\s*[=:]\s*"
    r"(?P<value>'[^']*'|\"[^\"]*\"|[^,)}\]\s]+)"
)


def parse_value(raw: str) -> object:
    """A value as ``server_args`` prints it (repr or JSON spelling) as the Python value."""
    if raw[:1] in ("'", '"'):
        return raw[1:-1]
    if raw in ("True", "true"):
        return True
    if raw in ("False", "false"):
        return False
    if raw in ("None", "null"):
        return None
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


class Topology:
    """The layout from the last ``server_args`` line seen (none yet: every tag is its TP rank)."""

    def __init__(self) -> None:
        self.args: dict[str, object] = {}
        self._cache: dict[Tag, int] = {}

    def read_server_args(self, s: str) -> None:
        """Take the layout from a line holding ``server_args=...`` (repr or dict form)."""
        body = s[s.index("server_args=") + len("server_args="):]
        found: dict[str, object] = {}
        for m in SERVER_ARG_RE.finditer(body):
            found.setdefault(m.group("key"), parse_value(m.group("value")))
        if found:
            self.args = found
            self._cache.clear()

    def global_rank(self, tag: Tag) -> int:
        """The global rank a line tagged ``tag`` comes from."""
        rank = self._cache.get(tag)
        if rank is None:
            rank = self._cache[tag] = self._place(tag)
        return rank

    def _place(self, tag: Tag) -> int:
        tokens = dict(tag)
        if TORCH_RANK in tokens:
            return tokens[TORCH_RANK]
        tp = tokens.get("TP", 0)
        tp_size = self.args.get("tp_size")
        if not isinstance(tp_size, int) or tp_size <= 0:
            return tp
        rank = tp
        pp = tokens.get("PP", 0)
        pp_size = self.args.get("pp_size")
        pp_size = pp_size if isinstance(pp_size, int) and pp_size > 0 else 1
        if pp:
            rank += pp * tp_size
        dp = tokens.get("DP", 0)
        if dp and self.plain_dp():
            rank += dp * tp_size * pp_size
        return rank

    def plain_dp(self) -> bool:
        """DP replicas each with their own TP group (not DP attention, where DPn sits inside the TP group)."""
        args = self.args
        dp = args.get("dp_size")
        if not isinstance(dp, int) or dp <= 1:
            return False
        attn_dp, attn_tp, tp = args.get("attn_dp_size"), args.get("attn_tp_size"), args.get("tp_size")
        attention_dp = (
            args.get("enable_dp_attention") is True
            or (isinstance(attn_dp, int) and attn_dp > 1)
            or (isinstance(attn_tp, int) and isinstance(tp, int) and 0 < attn_tp < tp)
        )
        return not attention_dp

    def rank_name(self, rank: int) -> str:
        """How SGLang's prefix names global rank ``rank`` (see `rank_name`)."""
        return rank_name(rank, self.args)

    def ranks_expected(self) -> int | None:
        """How many ranks the layout has (None before a server_args line with ``tp_size``)."""
        tp = self.args.get("tp_size")
        if not isinstance(tp, int) or tp <= 0:
            return None
        pp = self.args.get("pp_size")
        expected = tp * (pp if isinstance(pp, int) and pp > 0 else 1)
        dp = self.args.get("dp_size")
        if isinstance(dp, int) and self.plain_dp():
            expected *= dp
        return expected


def rank_name(rank: int, server_args: dict[str, object]) -> str:
    """A global rank as people read it: ``DP1 TP0`` for replica 1's first rank under plain DP (its TP rank
    local to the replica, PP between them as SGLang orders the prefix: ``DP1 PP0 TP3``), else ``TP5``.

    ``server_args``: the layout keys of the ``server_args`` line (`SERVER_ARGS_KEYS`)."""
    layout = Topology()
    layout.args = dict(server_args)
    tp = server_args.get("tp_size")
    if not layout.plain_dp() or not isinstance(tp, int) or tp <= 0:
        return f"TP{rank}"
    pp = server_args.get("pp_size")
    pp = pp if isinstance(pp, int) and pp > 0 else 1
    dp, inside = divmod(rank, tp * pp)
    pp_rank, tp_rank = divmod(inside, tp)
    return f"DP{dp}" + (f" PP{pp_rank}" if pp > 1 else "") + f" TP{tp_rank}"
