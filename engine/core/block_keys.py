"""Prefix-cache block keys: pure functions, shared by the block managers, the simulator and the fleet's
router (which computes in its own process the keys a replica holds)."""
from __future__ import annotations

from array import array
from hashlib import blake2b

# The parent key of a prompt's first block. A constant: a router in another process (the live fleet's
# proxy, engine/entrypoints/router) must compute the keys a replica's prefix cache holds (vLLM fixes its
# NONE_HASH for llm-d's precise prefix-cache scorer for the same reason).
ROOT_HASH = 0


def block_key(parent: int, tokens) -> int:
    """A full block's prefix-cache key: a 64-bit BLAKE2b digest of its parent's key and its token ids.
    Not Python's hash(): a tuple of ints hashes predictably, so a crafted prompt could take the key of
    another user's prefix block and plant its own KV under it, to be served to them (vLLM's
    CVE-2025-25183, fixed there with SHA-256); a second block with a given BLAKE2b key takes ~2**64
    tries. Deterministic across processes, as the live fleet's router needs."""
    data = parent.to_bytes(8, "little", signed=True) + array("q", tokens).tobytes()
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little", signed=True)


# vLLM's words for a salt it refuses (vllm/entrypoints/openai/protocol.py): the engine's and the server's.
BAD_CACHE_SALT = "Parameter 'cache_salt' must be a non-empty string if provided."


def bad_cache_salt(value) -> bool:
    """Whether `value` is a salt vLLM refuses: given (not None) but not a non-empty string."""
    return value is not None and not (isinstance(value, str) and value)


def cache_root(lora_name: str = "", cache_salt: str | None = None) -> int:
    """The parent key of a request's first block: ROOT_HASH for the base model unsalted, else a key of its own.
    - A LoRA adapter's requests share no block with another's, even with equal prompts. vLLM adds the
      adapter's name to every block's hash (vllm/v1/core/kv_cache_utils.py `_gen_lora_extra_hash_keys`); its
      name, not its id, since vLLM PR #27211: ids follow the order adapters were loaded in, so replicas would
      key one adapter apart, and a router could not compute them.
    - A request's `cache_salt` (vLLM's) shares blocks only with requests of the same salt, so one tenant
      cannot learn another's prompts by timing prefix hits. vLLM adds it to the first block's hash; every
      later key chains from that one, so both give the same sharing.
    A BLAKE2b digest of the pair under its own personalization: no block's key."""
    if not lora_name and not cache_salt:
        return ROOT_HASH
    digest = blake2b(repr((lora_name, cache_salt or "")).encode(), digest_size=8, person=b"prefix-root").digest()
    return int.from_bytes(digest, "little", signed=True)


def adapter_name(lora_id: int) -> str:
    """The name of adapter `lora_id` where only its id is given (a trace's `lora`; "" for 0, the base model):
    the planner's live runs load a trace's adapter k under this name, so the simulator keys its blocks alike."""
    return f"adapter-{lora_id}" if lora_id else ""


def chained_hashes(tokens: list[int], block_size: int, count: int, root: int = ROOT_HASH):
    """The prefix-cache keys of the first ``count`` full blocks of ``tokens``: each digests its
    parent's key (``root`` for the first) with its own token ids, so equal prefixes have equal keys."""
    parent = root
    for i in range(count):
        parent = block_key(parent, tokens[i * block_size:(i + 1) * block_size])
        yield parent


def prompt_block_hashes(token_ids: list[int], block_size: int, root: int = ROOT_HASH) -> list[int]:
    """The keys of the prompt blocks a prefix-cache hit may cover (never the last token's block:
    the last token is always computed), chained from `root` (cache_root's), as ``cached_prefix`` looks them up."""
    return list(chained_hashes(token_ids, block_size, (len(token_ids) - 1) // block_size, root))
