"""Property tests: random sequences of block-manager operations keep every invariant.

A shadow "physical memory" records which token each slot holds, and under
which version of which LoRA adapter it was computed, so the test can check
logical contents (after copy-on-write, swapping, prefix hits and adapters
unloaded), not just counters.
"""
from collections import Counter

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.block_keys import adapter_name, cache_root
from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import SequenceGroup, SequenceStatus, next_seq_id

BS = 4
NUM_GPU = 12
NUM_CPU = 12


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.bm = BlockManager(BS, NUM_GPU, NUM_CPU, watermark=0.0, enable_prefix_caching=True)
        self.gpu_mem: dict[int, list] = {b: [None] * BS for b in range(NUM_GPU)}
        self.cpu_mem: dict[int, list] = {b: [None] * BS for b in range(NUM_CPU)}
        self.seqs = []        # running sequences, each in a one-sequence group or forked
        self.swapped = []     # groups swapped out
        self.versions = {1: 0, 2: 0}     # adapter -> times it was unloaded (then loaded again, other weights)
        self.tags = {}        # seq id -> (adapter, its version): what its KV was computed with
        self.prompts = []     # the prompts added so far

    # -- helpers -------------------------------------------------------------
    def _write(self, seq, start):
        table = self.bm.block_table(seq)
        for pos in range(start, seq.num_tokens):
            block = table[pos // BS]
            assert self.bm.gpu.ref_counts[block] == 1, "wrote into a shared block"
            self.gpu_mem[block][pos % BS] = (self.tags[seq.seq_id], seq.token_ids[pos])
        seq.num_computed_tokens = seq.num_tokens
        self.bm.mark_computed(seq)

    def _contents(self, seq):
        """The tokens the sequence's slots hold; those computed, each with the sequence's own adapter version."""
        table = self.bm.block_table(seq)
        cells = [self.gpu_mem[table[p // BS]][p % BS] for p in range(seq.num_tokens)]
        tag = self.tags[seq.seq_id]
        assert all(cell[0] == tag for cell in cells[:seq.num_computed_tokens]), "KV of another adapter or version"
        return [cell and cell[1] for cell in cells]

    # -- rules ---------------------------------------------------------------
    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=14), lora=st.integers(0, 2))
    def add_prompt(self, tokens, lora):
        self.prompts.append(tokens)
        self._add(tokens, lora)

    @precondition(lambda self: self.prompts)
    @rule(i=st.integers(0, 100), lora=st.integers(0, 2))
    def add_prompt_again(self, i, lora):
        # (prefix hits: a prompt seen before, under the same adapter or another)
        self._add(self.prompts[i % len(self.prompts)], lora)

    def _add(self, tokens, lora):
        group = SequenceGroup("r", tokens, SamplingParams(), 0.0, lora_id=lora)
        if self.bm.num_free_blocks() < -(-len(tokens) // BS):
            return
        seq = group.seqs[0]
        self.tags[seq.seq_id] = (lora, self.versions.get(lora, 0))
        self.bm.allocate(group)
        seq.status = SequenceStatus.RUNNING
        cached = seq.num_computed_tokens
        assert cached % BS == 0 and cached < len(tokens)
        # A prefix hit returns blocks whose tokens equal the request's.
        assert self._contents(seq)[:cached] == tokens[:cached]
        self._write(seq, cached)
        self.seqs.append(seq)

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 100), token=st.integers(0, 2))
    def append(self, i, token):
        seq = self.seqs[i % len(self.seqs)]
        group = SequenceGroup("tmp", [0], SamplingParams(), 0.0)
        group.seqs = [seq]
        before = self._contents(seq)
        seq.append(token, 0.0)
        if not self.bm.can_append_slots(group):
            seq.token_ids.pop()
            return
        cow = self.bm.append_slots(seq)
        if cow is not None:
            src, dst = cow
            self.gpu_mem[dst] = list(self.gpu_mem[src])
        assert self._contents(seq)[:-1] == before
        self._write(seq, seq.num_tokens - 1)
        assert self._contents(seq) == seq.token_ids

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 100))
    def fork(self, i):
        parent = self.seqs[i % len(self.seqs)]
        child = parent.copy_as(next_seq_id())
        self.tags[child.seq_id] = self.tags[parent.seq_id]
        self.bm.fork(parent, child)
        self.seqs.append(child)
        assert self._contents(child) == child.token_ids

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 100))
    def free(self, i):
        seq = self.seqs.pop(i % len(self.seqs))
        self.bm.free(seq)

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 100))
    def swap_out(self, i):
        seq = self.seqs[i % len(self.seqs)]
        group = SequenceGroup("s", [0], SamplingParams(), 0.0)
        group.seqs = [seq]
        if not self.bm.can_swap_out(group):
            return
        expected = list(seq.token_ids)
        mapping = self.bm.swap_out(group)
        for gpu, cpu in mapping.items():
            self.cpu_mem[cpu] = list(self.gpu_mem[gpu])
        seq.status = SequenceStatus.SWAPPED
        self.seqs.remove(seq)
        self.swapped.append((group, expected))

    @precondition(lambda self: self.swapped)
    @rule()
    def swap_in(self):
        group, expected = self.swapped[0]
        if not self.bm.can_swap_in(group):
            return
        mapping = self.bm.swap_in(group)
        for cpu, gpu in mapping.items():
            self.gpu_mem[gpu] = list(self.cpu_mem[cpu])
        self.swapped.pop(0)
        seq = group.seqs[0]
        seq.status = SequenceStatus.RUNNING
        # Swap out then in restores the same logical contents.
        assert self._contents(seq) == expected
        self.seqs.append(seq)

    @rule(lora=st.integers(1, 2))
    def unload(self, lora):
        # The engine unloads an adapter once none of its requests is left; one loaded again under its name
        # (other weights: the next version) must never hit the old one's blocks.
        if any(self.tags[s.seq_id][0] == lora for s in self.seqs + [g.seqs[0] for g, _ in self.swapped]):
            return
        self.bm.forget_adapter(cache_root(adapter_name(lora)))
        self.versions[lora] += 1

    # -- invariants ----------------------------------------------------------
    @invariant()
    def no_leaks(self):
        bm = self.bm
        assert bm.num_free_blocks() + bm.num_used_blocks() == NUM_GPU
        in_use = {b for b in range(NUM_GPU) if bm.gpu.ref_counts[b] > 0}
        assert len(in_use) == bm.num_used_blocks()
        assert set(bm.gpu.free_list).isdisjoint(in_use) and set(bm.gpu.evictor).isdisjoint(in_use)

    @invariant()
    def ref_counts_match_tables(self):
        holders = Counter(b for table in self.bm.tables.values() for b in table)
        for b in range(NUM_GPU):
            assert self.bm.gpu.ref_counts[b] == holders.get(b, 0)
        cpu_holders = Counter(b for table in self.bm.cpu_tables.values() for b in table)
        for b in range(NUM_CPU):
            assert self.bm.cpu.ref_counts[b] == cpu_holders.get(b, 0)

    @invariant()
    def each_sequence_holds_ceil_blocks(self):
        for seq in self.seqs:
            assert len(self.bm.block_table(seq)) == -(-seq.num_tokens // BS)

    @invariant()
    def token_states_count_filled_slots(self):
        filled = {}
        for seq in self.seqs:
            table = self.bm.block_table(seq)
            for i, b in enumerate(table):
                filled[b] = max(filled.get(b, 0), min(BS, seq.num_tokens - i * BS))
        assert self.bm.token_slots_used() == sum(filled.values())

    def teardown(self):
        for seq in self.seqs:
            self.bm.free(seq)
        for group, _ in self.swapped:
            self.bm.free(group.seqs[0])
        # All free at the end.
        assert self.bm.num_free_blocks() == NUM_GPU
        assert self.bm.num_free_cpu_blocks() == NUM_CPU
        assert self.bm.token_slots_used() == 0


TestBlockManagerProperties = BlockManagerMachine.TestCase
TestBlockManagerProperties.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
