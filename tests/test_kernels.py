"""electra_jax.kernels: which part of the step an operation belongs to, and the kernels of a compiled program."""


import re
from types import SimpleNamespace

import pytest

from electra_jax import config as config_lib, kernels, sharding
from electra_jax.masking import SpecialIds
from electra_jax.train_step import Pretraining


@pytest.mark.parametrize('op_name, expected', [
    ('jit(train_step)/jvp(vmap())/masking/vmap(jit(_threefry_split))/mask_tokens/add', 'masking'),
    ('jit(train_step)/sampling/vmap()/cumsum', 'sampling'),
    ('jit(train_step)/optimizer/add', 'optimizer'),
    ('jit(train_step)/jvp(Electra.discriminator_logits)/discriminator/encoder/layer_2/output/Dropout_0/shift_left',
     'dropout'),
    ('jit(train_step)/transpose(jvp(Electra.generator_logits))/Electra._generator_hidden/generator/encoder/layer_1/'
     'output/dense/dot_general', 'model'),
    ('jit(train_step)/reduce_sum', 'loss'),
    ('', 'other'),
])
def test_group(op_name, expected):
  assert kernels.group(op_name) == expected


HLO = """HloModule jit_train_step, entry_computation_layout={()->()}

%fused_add (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  ROOT %add.1 = f32[4]{0} add(%p0, %p0), metadata={op_name="jit(train_step)/optimizer/add"}
}

%body (arg: (s32[], f32[4])) -> (s32[], f32[4]) {
  %arg = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = f32[4]{0} get-tuple-element(%arg), index=1
  %loop_fusion.2 = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_add, metadata={op_name="jit(train_step)/masking/while/body/add"}
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %loop_fusion.2)
}

%cond (arg.1: (s32[], f32[4])) -> pred[] {
  %arg.1 = (s32[], f32[4]{0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[4], b: f32[4,4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %b = f32[4,4]{1,0} parameter(1)
  %gemm.1 = (f32[4,4]{1,0}, s8[0]{0}) custom-call(%b, %b), custom_call_target="__cublas$gemm", metadata={op_name="jit(train_step)/jvp(Electra.generator_logits)/generator/encoder/layer_0/attention/self/query/dot_general"}
  %sort.3 = f32[4]{0} sort(%a), dimensions={0}, to_apply=%cond, metadata={op_name="jit(train_step)/sampling/sort"}
  %init = (s32[], f32[4]{0}) tuple(%a, %a)
  %while.5 = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"128"}}, metadata={op_name="jit(train_step)/masking/while"}
  %loop_fusion.9 = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused_add, metadata={op_name="jit(train_step)/optimizer/add"}
  ROOT %out = f32[4]{0} get-tuple-element(%while.5), index=1
}
"""


def test_parse_counts_launches_per_step_through_loops():
  found = {i.name: i for i in kernels.parse(HLO)}
  assert set(found) == {'gemm.1', 'sort.3', 'while.5', 'loop_fusion.2', 'loop_fusion.9'}
  assert found['gemm.1'].kind == 'cublas' and found['sort.3'].kind == 'sort'
  assert found['loop_fusion.2'].count == 128 and found['loop_fusion.9'].count == 1  # inside the loop: per trip
  table = kernels.counts(list(found.values()))
  assert table['masking'] == {'fusion': 128, 'while': 1}
  assert table['model'] == {'cublas': 1} and table['sampling'] == {'sort': 1} and table['optimizer'] == {'fusion': 1}
  text = kernels.format_counts(list(found.values()))
  assert text.splitlines()[-1].split()[:2] == ['all', '131']  # 128 + 1 + 1 + 1 kernels, the loop launches none
  assert kernels.where(HLO)['sort.3'] == 'jit(train_step)/sampling/sort'


@pytest.mark.slow  # compiles a one-layer train step (a few seconds)
def test_the_compiled_step_names_its_parts():
  """The train step's named scopes reach the compiled program: its kernels fall into masking, sampling, model,
  loss and optimizer (the groups of a GPU profile), and the model's dropout into 'dropout': as the GPU draws it
  (rbg_tower), a layer's Dropout, the embeddings' and the tower's masks drawn at once (the last two were counted as
  the model's)."""
  c = config_lib.load({'batch_size': 8, 'data': {'max_seq_length': 16},
                       'model': {'vocab_size': 50, 'embedding_size': 16, 'hidden_size': 16, 'num_layers': 1,
                                 'num_heads': 1, 'intermediate_size': 32, 'max_position_embeddings': 16,
                                 'dropout_draw': 'rbg_tower'}})
  run = Pretraining(c, SpecialIds(pad=0, cls=2, sep=3, mask=4), sharding.make_mesh(c.mesh))
  hlo = run.lower().compile().as_text()
  table = kernels.counts(kernels.parse(hlo))
  assert {'masking', 'sampling', 'model', 'dropout', 'loss', 'optimizer'} <= set(table), dict(table)
  masks = {op for op in kernels.where(hlo).values() if re.search(r'\bkeep\b|tower_keep', op)}
  assert masks and {kernels.group(op) for op in masks} == {'dropout'}


DOT_HLO = """HloModule m, entry_computation_layout={()->()}

%fused_dot (p0: f32[2,3], p1: f32[3,5]) -> f32[2,5] {
  %p0 = f32[2,3]{1,0} parameter(0)
  %p1 = f32[3,5]{1,0} parameter(1)
  ROOT %dot.1 = f32[2,5]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[2,3], b: f32[3,5]) -> f32[2,5] {
  %a = f32[2,3]{1,0} parameter(0)
  %b = f32[3,5]{1,0} parameter(1)
  ROOT %gemm_fusion.1 = f32[2,5]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot
}
"""


@pytest.mark.parametrize('bandwidth, peak_flops, seconds', [
    (62.0, 60.0, 2.0),  # memory-bound: 124 bytes moved (a 2x3 and a 3x5 float32 read, a 2x5 written) at 62 B/s
    (124.0, 20.0, 3.0),  # compute-bound: 2 x 10 outputs x 3 contracted = 60 FLOPs at 20 FLOP/s
])
def test_roofline_by_hand(bandwidth, peak_flops, seconds):
  assert kernels.roofline(DOT_HLO, kernels.parse(DOT_HLO), bandwidth, peak_flops) == {'gemm_fusion.1': seconds}


def test_traced_kernels_against_their_roofline_by_hand():
  """DOT_HLO's fusion needs 2 s a launch at 62 B/s (test_roofline_by_hand); traced at 5 s a step over 2 launches it
  reached 4 of its 5 s. A kernel the program does not name (a copy the runtime adds) has no least time."""
  gemm = kernels.Timed('gemm_fusion.1', 'model', 5000.0, 2)
  copy = kernels.Timed('memcpy', 'other', 1.0, 1)
  rows = kernels.against_roofline([copy, gemm], DOT_HLO, 62.0, 60.0)
  assert rows == [(gemm, 'fusion', 4000.0), (copy, 'not in the program', 0.0)]  # the farthest from its least first
  assert kernels.by_kind(rows) == {'fusion': (5000.0, 4000.0), 'not in the program': (1.0, 0.0)}
  assert '     80.0%' in kernels.format_roofline(rows)


SCAN_HLO = """HloModule m, entry_computation_layout={()->()}

%fused_scan (p0: f32[12,4], p1: s32[], p2: f32[12,4], p3: f32[1,4]) -> f32[12,4] {
  %p0 = f32[12,4]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %ds = f32[1,4]{1,0} dynamic-slice(%p0, %p1, %zero), dynamic_slice_sizes={1,4}
  %p3 = f32[1,4]{1,0} parameter(3)
  %add = f32[1,4]{1,0} add(%ds, %p3)
  %p2 = f32[12,4]{1,0} parameter(2)
  ROOT %dus = f32[12,4]{1,0} dynamic-update-slice(%p2, %add, %p1, %zero)
}

ENTRY %main (a: f32[12,4], i: s32[], b: f32[12,4], c: f32[1,4]) -> f32[12,4] {
  %a = f32[12,4]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %b = f32[12,4]{1,0} parameter(2)
  %c = f32[1,4]{1,0} parameter(3)
  ROOT %loop_dynamic_update_slice_fusion.1 = f32[12,4]{1,0} fusion(%a, %i, %b, %c), kind=kLoop, calls=%fused_scan
}
"""


def test_roofline_counts_the_slices_a_scanned_layer_reads_and_writes():
  """A layer of a scan reads its row of the stacked weights (dynamic-slice) and writes its row of the stacked
  results in place (dynamic-update-slice): 16 bytes read of the 192-byte stack, the index 4, the 16-byte addend,
  the 16-byte row written, the stack it is written into not read: 52 bytes, not the 596 of the whole arrays."""
  found = kernels.parse(SCAN_HLO)
  assert kernels.roofline(SCAN_HLO, found, 52.0, 1e12) == {'loop_dynamic_update_slice_fusion.1': 1.0}


@pytest.mark.parametrize('read', [
    '%ds = f32[1,4]{1,0} slice(%p0), slice={[3:4], [0:4]}',  # a static slice: 16 of the stack's 192 bytes
    # a slice of its conversion (a weight of optimizer.FlatParams' vector cast to bfloat16): still 16 bytes read
    '%cast = bf16[12,4]{1,0} convert(%p0)\n  %row = bf16[1,4]{1,0} slice(%cast), slice={[3:4], [0:4]}\n'
    '  %ds = f32[1,4]{1,0} convert(%row)',
])
def test_roofline_counts_the_slices_a_kernel_reads(read):
  """The scan's kernel reading its row by a static slice, directly or of a conversion: 52 bytes moved again."""
  hlo = SCAN_HLO.replace('%ds = f32[1,4]{1,0} dynamic-slice(%p0, %p1, %zero), dynamic_slice_sizes={1,4}', read)
  assert read in hlo
  assert kernels.roofline(hlo, kernels.parse(hlo), 52.0, 1e12) == {'loop_dynamic_update_slice_fusion.1': 1.0}


def test_time_by_group_sums_each_part_of_the_step_costliest_first():
  ops = [kernels.Timed('fusion.1', 'model', 2.0, 1), kernels.Timed('gemm.2', 'model', 3.5, 2),
         kernels.Timed('fusion.3', 'optimizer', 4.0, 100), kernels.Timed('copy.4', 'other', 0.25, 0.5)]
  assert kernels.by_group(ops) == {'model': (5.5, 3), 'optimizer': (4.0, 100), 'other': (0.25, 0.5)}
  assert list(kernels.by_group(ops)) == ['model', 'optimizer', 'other']


# jax 0.11's XLA:GPU runs some fusions asynchronously: a fusion-start (its result: ((operands), results, context))
# launches the kernel, its fusion-done only waits for it.
ASYNC_HLO = """HloModule m, entry_computation_layout={()->()}

%fused_slice (p0: f32[4,8]) -> f32[1,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  ROOT %slice.1 = f32[1,8]{1,0} slice(%p0), slice={[0:1], [0:8]}
}

ENTRY %main (a: f32[4,8]) -> f32[1,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %fusion-start = ((f32[4,8]{1,0}), f32[1,8]{1,0}, u32[]) fusion-start(%a), kind=kLoop, calls=%fused_slice, metadata={op_name="jit(f)/masking/slice"}
  ROOT %fusion-done = f32[1,8]{1,0} fusion-done(%fusion-start), metadata={op_name="jit(f)/masking/slice"}
}
"""


# A fusion whose own line names no jax operation (a cumulative sum's reduce-window, as XLA:GPU leaves some).
CUMSUM_HLO = """HloModule m, entry_computation_layout={()->()}

%fused_cumsum (p0: f32[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  %c = f32[] constant(0)
  %r = f32[8]{0} reduce-window(%p0, %c), window={size=8 pad=7_0}, to_apply=%add, metadata={op_name="jit(train_step)/sampling/vmap()/cumsum/reduce_window"}
  ROOT %n = f32[8]{0} negate(%r), metadata={op_name="jit(train_step)/sampling/vmap()/neg"}
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  ROOT %input_reduce_window_fusion = f32[8]{0} fusion(%a), kind=kLoop, calls=%fused_cumsum
}
"""


def test_a_fusion_that_names_no_operation_takes_what_its_body_shares():
  """Such fusions (pads, reduce-windows: ~3% of Small's least time) went to 'other'; the instructions they fuse
  carry op_names, whose shared path is where the kernel comes from."""
  (fusion,) = kernels.parse(CUMSUM_HLO)
  assert fusion.op_name == 'jit(train_step)/sampling/vmap()' and kernels.group(fusion.op_name) == 'sampling'
  assert kernels.where(CUMSUM_HLO)['input_reduce_window_fusion'] == 'jit(train_step)/sampling/vmap()'


def test_an_async_fusion_is_one_kernel_of_its_slice_and_result():
  """One launch, not two; it moves the row it slices (32 bytes) and the row it writes (32), not its result tuple's
  copy of the operand (128 more)."""
  (start,) = kernels.parse(ASYNC_HLO)
  assert (start.name, start.kind, start.count, kernels.group(start.op_name)) == ('fusion-start', 'fusion', 1,
                                                                                 'masking')
  assert kernels.roofline(ASYNC_HLO, [start], 1.0, 1.0) == {'fusion-start': 64.0}


def _trace(*planes):
  """A profiler trace's planes as jax.profiler.ProfileData gives them: {plane: {line: [(event, ns, stats)]}}."""
  return [SimpleNamespace(name=plane, lines=[
      SimpleNamespace(name=line, events=[SimpleNamespace(name=e, duration_ns=ns, stats=list(stats.items()))
                                         for e, ns, stats in events]) for line, events in lines.items()])
          for plane, lines in planes]


def test_a_gpu_trace_is_read_from_the_first_gpus_streams():
  """2 steps traced: the kernels and copies on GPU 0's streams, and any event naming its HLO instruction (hlo_op);
  not the lines derived from them, nor CUPTI's overhead, nor GPU 1's copy of the step (each was summed in)."""
  streams = {'Stream #7(Kernel)': [('fused_slice', 2_000_000, {'hlo_op': 'fusion-start'})] * 2,
             'Stream #8(MemcpyD2D)': [('MemcpyD2D', 1_000_000, {})],
             'XLA Ops': [('fusion-start', 2_000_000, {'hlo_op': 'fusion-start'})] * 2,
             'CUPTI overhead': [('overhead', 9_000_000, {})],
             'a line of another name': [('loop_add_fusion_3', 4_000_000, {'hlo_op': 'loop_add_fusion.3'})]}
  planes = _trace(('/host:CPU', {'tf_XLA': [('fusion-start', 5_000_000, {})]}), ('/device:GPU:1', streams),
                  ('/device:GPU:0', streams))
  assert kernels.timed_events(planes, ASYNC_HLO, 2) == [
      kernels.Timed('fusion-start', 'masking', 2.0, 1.0, 'jit(f)/masking/slice'),
      kernels.Timed('loop_add_fusion.3', 'other', 2.0, 0.5, ''), kernels.Timed('MemcpyD2D', 'other', 0.5, 0.5, '')]
  with pytest.raises(ValueError, match='^the trace holds no kernel of /device:GPU:0 .could CUPTI record them'):
    kernels.timed_events(_trace(('/device:GPU:0', {'XLA Ops': streams['XLA Ops']})), ASYNC_HLO, 2)


def _graphs_hlo() -> str:
  """An ENTRY of 6 fusions, a threefry custom call, 2 fusions and a cuBLAS GEMM, a while loop, 5 fusions and a
  fusion of 600 operands."""
  def fusion(i, operands='%a', scope='model'):
    return (f'  %fusion.{i} = f32[4]{{0}} fusion({operands}), kind=kLoop, calls=%fused_add, '
            f'metadata={{op_name="jit(train_step)/{scope}/add"}}')
  lines = [fusion(i) for i in range(6)]
  lines.append('  %threefry.1 = u32[4]{0} custom-call(%a), custom_call_target="cu_threefry2x32_ffi", '
               'metadata={op_name="jit(train_step)/masking/threefry2x32"}')
  lines += [fusion(i) for i in (6, 7)]
  lines.append('  %gemm.1 = (f32[4,4]{1,0}, s8[0]{0}) custom-call(%a, %a), custom_call_target="__cublas$gemm"')
  lines.append('  %while.1 = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body, '
               'metadata={op_name="jit(train_step)/masking/while"}')
  lines += [fusion(i) for i in range(8, 13)]
  lines.append(fusion(13, ', '.join(['%a'] * 600), 'optimizer'))
  return HLO.split('ENTRY')[0] + 'ENTRY %main (a: f32[4]) -> f32[4] {\n' + '\n'.join(lines) + '\n}\n'


def test_graphs_are_runs_of_graph_compatible_kernels_ended_by_the_rest():
  got = kernels.graphs(_graphs_hlo())
  # 6 fusions: a graph; the threefry call ends it and runs alone; 2 fusions and the GEMM (3 < 5 kernels) run alone,
  # ended by the loop (whose body the host launches); 5 fusions: a graph, ended by the fusion of 601 arguments.
  assert got.sizes == (6, 5)
  assert got.alone == 1 + 3 + 1
  assert got.breakers == {('cu_threefry2x32_ffi', 'masking'): 1, ('while', 'masking'): 1, ('fusion', 'optimizer'): 1}
  assert str(got).startswith('2 CUDA graphs of 11 commands (largest 6), 5 kernels launched alone; ended by: ')
  assert kernels.graphs(_graphs_hlo(), min_size=7).sizes == ()
  # With loops recorded (WHILE): the loop, whose body is one fusion, joins the 2 fusions, the GEMM and the 5 fusions.
  looped = kernels.graphs(_graphs_hlo(), loops=True)
  assert looped.sizes == (6, 3 + 1 + 5) and looped.alone == 2
  assert looped.breakers == {('cu_threefry2x32_ffi', 'masking'): 1, ('fusion', 'optimizer'): 1}
  threefry_in_the_loop = _graphs_hlo().replace('fusion(%x), kind=kLoop, calls=%fused_add',
                                               'custom-call(%x), custom_call_target="cu_threefry2x32_ffi"')
  assert kernels.graphs(threefry_in_the_loop, loops=True).sizes == (6, 5)
  # A body that slices at the iteration's index (a scan's layers) is recorded only if XLA may unroll the loop.
  sliced_in_the_loop = _graphs_hlo().replace(
      'fusion(%x), kind=kLoop, calls=%fused_add',
      'fusion(%x), kind=kCustom, calls=%fused_add, backend_config={"fusion_backend_config":{"kind":"__custom_fusion",'
      '"custom_fusion_config":{"name":"dynamic_slice_fusion","kernel_index":0}}}')
  assert kernels.graphs(sliced_in_the_loop, loops=True).sizes == (6, 5)
  assert kernels.graphs(sliced_in_the_loop, loops=True, unroll=True).sizes == (6, 9)
  # The loop's body, launched at every iteration: its one fusion is fewer than 5 commands, so launched alone.
  assert (kernels.graphs(_graphs_hlo(), computation='body').alone, kernels.graphs(_graphs_hlo(), min_size=1,
                                                                                   computation='body').sizes) == (1, (1,))


@pytest.mark.parametrize('xla_flags, expected', [
    ('', {'loops': False, 'min_size': 5, 'unroll': False}),
    ('--xla_gpu_enable_command_buffer=', None),
    ('--xla_gpu_autotune_level=0 --xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL',
     {'loops': True, 'min_size': 5, 'unroll': False}),
    ('--xla_gpu_enable_command_buffer=+WHILE --xla_gpu_command_buffer_unroll_loops=true',
     {'loops': True, 'min_size': 5, 'unroll': True}),
    ('--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUDNN --xla_gpu_graph_min_graph_size=1',
     {'loops': False, 'min_size': 1, 'unroll': False}),
    ('--xla_gpu_enable_command_buffer=-WHILE', {'loops': False, 'min_size': 5, 'unroll': False}),
])
def test_graph_settings_from_xla_flags(xla_flags, expected):
  assert kernels.graph_settings(xla_flags) == expected
