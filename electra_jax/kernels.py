"""What a compiled step launches, grouped by the part of the step it comes from: read from XLA's compiled HLO text
(`compiled.as_text()`, e.g. compiled for a GPU on any machine by `python -m electra_jax.aot`) or from a profiler
trace of steps run on a GPU (`bench/step_throughput.py --profile=N`).

Every instruction of the compiled program carries the jax operation it came from (`op_name`), and the step names its
parts with `jax.named_scope` ('masking', 'sampling', 'optimizer'); the model's operations carry the Flax module path
(`generator/encoder/layer_3/...`), and its dropout the name of a `Dropout` module or of the tower's `tower_keep`
(its layers' masks in one draw); the rest of the step is its loss and metrics. `group` maps an op_name onto
GROUPS. A kernel is what the GPU launches: a fusion, a library call (cuBLAS, cuDNN, a Triton kernel:
`custom-call`), or one of the few instructions XLA runs unfused (sort, scatter, copy, a collective); instructions
inside a `while` loop launch once per iteration.
"""

import collections
import dataclasses
import math
import os
import re

GROUPS = ('masking', 'sampling', 'model', 'dropout', 'loss', 'optimizer', 'other')

# Instructions that launch no kernel of their own (views, tuples, constants, control flow around other kernels).
_FREE = {'parameter', 'get-tuple-element', 'tuple', 'bitcast', 'constant', 'after-all', 'partition-id',
         'replica-id', 'opt-barrier', 'add-dependency', 'call', 'while', 'conditional', 'domain',
         'copy-done', 'all-reduce-done', 'all-gather-done', 'collective-permute-done', 'send-done', 'recv-done',
         'async-done', 'async-update'}
_HOST = {'infeed', 'outfeed', 'send', 'recv', 'host-compute'}


def group(op_name: str) -> str:
  """The part of the step (one of GROUPS) that the jax operation `op_name` belongs to."""
  if 'optimizer' in op_name:
    return 'optimizer'
  if 'sampling' in op_name:
    return 'sampling'
  if 'masking' in op_name:
    return 'masking'
  if re.search(r'(/Dropout_\d+|/dropout|\.tower_keep)(/|$)', op_name):  # a layer's, the embeddings', a tower's masks
    return 'dropout'
  if re.search(r'Electra\.|/(generator|discriminator|embeddings)[/.]', op_name):
    return 'model'
  if op_name.startswith('jit('):
    return 'loss'  # the rest of the step: the loss and metrics, and what glues the parts together
  return 'other'


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str  # the HLO instruction's name, e.g. 'loop_add_fusion.3' (what a GPU trace calls it, as `hlo_op`)
  opcode: str  # 'fusion', 'custom-call', 'sort', ...
  kind: str  # what it launches: 'fusion', 'cublas', 'cudnn', 'triton', 'custom-call', 'sort', ..., '' for none
  op_name: str  # the jax operation it came from
  count: int  # launches per call of the program (the trip counts of the loops around it multiplied)
  trips: int = 1  # a while loop's iterations (its known trip count)


_HEADER = re.compile(r'^(ENTRY )?%?([\w.\-]+) \((.*)\) -> .*\{\s*$')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\(')


@dataclasses.dataclass
class Module:
  """A compiled HLO module's text, read once: its computations and, by name, each instruction's line."""
  entry: str = ''
  computations: dict[str, tuple[str, list[str]]] = dataclasses.field(default_factory=dict)  # (parameters, lines)
  lines: dict[str, str] = dataclasses.field(default_factory=dict)  # instruction name: its line
  # instruction name: its result's type, e.g. 'f32[4,2]{1,0}' or a tuple of them
  shapes: dict[str, str] = dataclasses.field(default_factory=dict)

  def fused(self, name: str) -> str:
    """The text of the computation that fusion `name` calls (what its kernel computes; '' if none)."""
    called = re.search(r'calls=%?([\w.\-]+)', self.lines.get(name, ''))
    params, lines = self.computations.get(called.group(1), ('', [])) if called else ('', [])
    return params + '\n' + '\n'.join(lines) if lines else ''

  def origin(self, name: str) -> str:
    """The jax op_name instruction `name` came from: its line's, else (a fusion whose line names none: a pad, a
    cumulative sum's reduce-window) the longest path the op_names inside its fused computation share."""
    own = _op_name(self.lines.get(name, ''))
    inside = [op.split('/') for line in ([] if own else self.fused(name).splitlines()) if (op := _op_name(line))]
    return own or '/'.join(os.path.commonprefix(inside))


def _op_name(line: str) -> str:
  m = re.search(r'op_name="([^"]*)"', line)
  return m.group(1) if m else ''


def read(hlo: str) -> Module:
  """The computations and instructions of a compiled HLO module's text (`compiled.as_text()`)."""
  module, current = Module(), None
  for line in hlo.splitlines():
    header = _HEADER.match(line)
    if header:
      current = header.group(2)
      module.computations[current] = (header.group(3), [])
      if header.group(1):
        module.entry = current
    elif current is not None and line.startswith('  ') and ' = ' in line:
      module.computations[current][1].append(line)
      m = _INSTRUCTION.match(line)
      if m and m.group(1) not in module.lines:
        module.lines[m.group(1)], module.shapes[m.group(1)] = line, m.group(2)
  return module


def _kind(opcode: str, line: str) -> str:
  if opcode == 'fusion':
    return 'triton' if '__triton' in line else 'fusion'
  if opcode == 'custom-call':
    target = re.search(r'custom_call_target="([^"]+)"', line)
    target = target.group(1) if target else ''
    if 'cublas' in target or 'gemm' in target.lower():
      return 'cublas'
    if 'cudnn' in target:
      return 'cudnn'
    if 'triton' in target:
      return 'triton'
    return f'custom-call {target}'
  if opcode in _FREE or opcode.endswith(('-done', '-update')):  # an async op launches at its -start
    return ''
  return opcode.removesuffix('-start')


def parse(hlo: str | Module) -> list[Instruction]:
  """The kernel-launching instructions of a compiled HLO module, with their launches per call.

  Walks from ENTRY through the computations it calls (while bodies and conditions, called computations such as
  command buffers, conditional branches), not into fusions (a fusion is one kernel)."""
  module = read(hlo) if isinstance(hlo, str) else hlo
  out = []

  def walk(name: str, times: int, seen: tuple):
    if name not in module.computations or name in seen:
      return
    for line in module.computations[name][1]:
      m = _INSTRUCTION.match(line)
      if not m:
        continue
      inst, shape, opcode = m.groups()
      op_name = module.origin(inst)
      if opcode == 'while':
        trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
        n = int(trips.group(1)) if trips else 1
        out.append(Instruction(inst, 'while', 'while', op_name, times, n))
        for key in ('body', 'condition'):
          called = re.search(rf'{key}=%?([\w.\-]+)', line)
          if called:
            walk(called.group(1), times * n, seen + (name,))
        continue
      if opcode in ('call', 'conditional', 'async-start'):
        for called in re.findall(r'(?:to_apply|calls|branch_computations=\{|true_computation|false_computation)'
                                 r'=?%?([\w.\-]+)', line):
          walk(called, times, seen + (name,))
      kind = _kind(opcode, line)
      if opcode in _HOST or 'S(5)' in shape:
        kind = f'host transfer ({opcode})'
      if kind:
        out.append(Instruction(inst, opcode, kind, op_name, times))

  walk(module.entry, 1, ())
  return out


# What XLA:GPU records into a CUDA graph ("command buffer") under its default --xla_gpu_enable_command_buffer
# (FUSION, CUBLAS, CUBLASLT, CUSTOM_CALL, CUDNN, DYNAMIC_SLICE_FUSION) once the CUDA driver and toolkit are 12.3 or
# newer: kernels (fusions, Triton GEMMs, sorts), device copies and library calls. A custom call is recorded only when
# its FFI handler declares itself graph-compatible, which the compiled text does not say: one that is not cuBLAS's or
# cuDNN's counts here as ending a graph (jax's `cu_threefry2x32_ffi` does; its registration has no traits). While
# loops and collectives are not in the default kinds; with WHILE added (`--xla_gpu_enable_command_buffer=+WHILE`), a
# loop whose condition and body hold only graph-compatible instructions is recorded too, as one command, unless its
# body slices arrays at the iteration's index in a dynamic-slice fusion (a scan's layers do), which XLA records only
# when it may unroll the loop into the graph (`--xla_gpu_command_buffer_unroll_loops=true`).
_GRAPHED = {'fusion', 'triton', 'cublas', 'cudnn', 'sort', 'copy'}
_MAX_GRAPHED_ARGUMENTS = 512  # XLA keeps a fusion with more operands and results out of graphs (a CUDA driver bug)


@dataclasses.dataclass(frozen=True)
class Graphs:
  """How the top level of a compiled GPU program runs: CUDA graphs of consecutive graph-compatible commands, and the
  kernels the host launches one by one between them (each of which ends the graph before it)."""
  sizes: tuple[int, ...]  # commands in each CUDA graph, in program order (a loop recorded whole is one)
  alone: int  # kernels launched one by one: the breakers and runs of fewer than `min_size` commands
  breakers: collections.Counter  # {(kind, group): count} of the instructions that end graphs

  def __str__(self):
    ended = ', '.join(f'{kind} x{n} ({group})' for (kind, group), n in self.breakers.most_common())
    return (f'{len(self.sizes)} CUDA graphs of {sum(self.sizes)} commands (largest {max(self.sizes, default=0)}), '
            f'{self.alone} kernels launched alone; ended by: {ended or "nothing"}')


def graphs(hlo: str | Module, min_size: int = 5, loops: bool = False, unroll: bool = False,
           computation: str = '') -> Graphs:
  """The CUDA graphs XLA:GPU would form from the ENTRY computation of a compiled program (its instructions are in
  schedule order), or from `computation` (a while loop's body: its graphs, launched at every iteration), by the
  rules above: consecutive graph-compatible commands, at least `min_size` of them (--xla_gpu_graph_min_graph_size,
  5 by default). A while loop is one command with `loops` (WHILE enabled) if all it runs is graph-compatible (and,
  if it slices at its index, with `unroll`); otherwise it ends the graph before it and its body runs as its own
  graphs at every iteration. An estimate of XLA's runtime pass from the compiled text, not a reading of it."""
  module = read(hlo) if isinstance(hlo, str) else hlo
  sizes, alone, run, breakers = [], 0, 0, collections.Counter()

  def close():
    nonlocal run, alone
    if run >= min_size:
      sizes.append(run)
    else:
      alone += run
    run = 0

  for line in module.computations.get(computation or module.entry, ('', []))[1]:
    kind = _graph_kind(module, line, loops, unroll)
    if kind is None:
      continue
    if kind == '':
      run += 1
      continue
    close()
    alone += kind != 'while'
    breakers[kind.removeprefix('custom-call '), group(module.origin(_INSTRUCTION.match(line).group(1)))] += 1
  close()
  return Graphs(tuple(sizes), alone, breakers)


def graph_settings(xla_flags: str) -> dict | None:
  """`graphs`' keyword arguments for the XLA_FLAGS `xla_flags` (None: command buffers off): WHILE among the
  command kinds of --xla_gpu_enable_command_buffer (a list, or +/- changes to the defaults), the
  --xla_gpu_graph_min_graph_size, --xla_gpu_command_buffer_unroll_loops."""
  kinds = re.search(r'--xla_gpu_enable_command_buffer=(\S*)', xla_flags)
  if kinds and not kinds.group(1):
    return None
  size = re.search(r'--xla_gpu_graph_min_graph_size=(\d+)', xla_flags)
  loops = bool(kinds) and any(k.lstrip('+') == 'WHILE' for k in kinds.group(1).split(','))
  unroll = bool(re.search(r'--xla_gpu_command_buffer_unroll_loops=(true|1)\b', xla_flags))
  return {'loops': loops, 'min_size': int(size.group(1)) if size else 5, 'unroll': unroll}


def _graph_kind(module: Module, line: str, loops: bool, unroll: bool, seen: tuple = ()) -> str | None:
  """None for an instruction that runs nothing, '' for one a CUDA graph can hold, else what it launches."""
  m = _INSTRUCTION.match(line)
  if not m:
    return None
  _, shape, opcode = m.groups()
  if opcode == 'while':
    if not loops:
      return 'while'
    called = [c for key in ('condition', 'body') for c in re.findall(rf'{key}=%?([\w.\-]+)', line)]
    inner = [(c, x) for c in called for x in module.computations.get(c, ('', []))[1]]
    held = (all(c not in seen for c in called)
            and all(_graph_kind(module, x, loops, unroll, seen + (c,)) in (None, '') for c, x in inner)
            and (unroll or not any('"name":"dynamic_slice_fusion"' in x for _, x in inner)))
    return '' if held else 'while'
  kind = _kind(opcode, line)
  if not kind:
    return None
  if opcode in _HOST or 'S(5)' in shape:
    return f'host transfer ({opcode})'
  if kind in _GRAPHED and (opcode != 'fusion' or _arguments(line, shape) <= _MAX_GRAPHED_ARGUMENTS):
    return ''
  return kind


def _arguments(line: str, shape: str) -> int:
  """A fusion's operands plus its array results."""
  operands = re.search(r' fusion\((.*?)\), kind=', line)
  return (operands.group(1).count('%') if operands else 0) + max(1, len(re.findall(r'\[', shape)))


def counts(instructions: list[Instruction]) -> dict[str, collections.Counter]:
  """{group: Counter(kind: launches per call)}."""
  table = collections.defaultdict(collections.Counter)
  for i in instructions:
    table[group(i.op_name)][i.kind] += i.count
  return table


def format_counts(instructions: list[Instruction]) -> str:
  """A table of launches per call: one row per group, one column per kind of kernel, and the loops."""
  table = counts(instructions)
  kinds = sorted({k for row in table.values() for k in row},
                 key=lambda k: (k not in ('fusion', 'cublas', 'cudnn', 'triton'), k))
  lines = [f'{"group":10s} {"total":>6s}  ' + '  '.join(f'{k:>8s}' for k in kinds)]
  for g in GROUPS:
    if g in table:
      row = table[g]
      lines.append(f'{g:10s} {sum(v for k, v in row.items() if k != "while"):6d}  '
                   + '  '.join(f'{row.get(k, 0):8d}' for k in kinds))
  total = collections.Counter()
  for row in table.values():
    total.update(row)
  lines.append(f'{"all":10s} {sum(v for k, v in total.items() if k != "while"):6d}  '
               + '  '.join(f'{total.get(k, 0):8d}' for k in kinds))
  return '\n'.join(lines)


def summary(instructions: list[Instruction]) -> str:
  """One line: launches per call by kind and by part of the step, the loops and host transfers."""
  kinds, groups = collections.Counter(), collections.Counter()
  for i in instructions:
    if i.kind != 'while':
      kinds[i.kind] += i.count
      groups[group(i.op_name)] += i.count
  loops = sum(1 for i in instructions if i.kind == 'while')
  host = sum(v for k, v in kinds.items() if k.startswith('host transfer'))
  return (f'{sum(kinds.values())} kernel launches per call ({", ".join(f"{k} {v}" for k, v in kinds.most_common())})'
          f'; by part: {", ".join(f"{g} {v}" for g, v in groups.most_common())}; {loops} while loops, {host} host '
          'transfers')


def where(hlo: str | Module) -> dict[str, str]:
  """{instruction name: the jax op_name it came from} for every instruction of a compiled HLO text."""
  module = read(hlo) if isinstance(hlo, str) else hlo
  return {name: op for name in module.lines if (op := module.origin(name))}


@dataclasses.dataclass(frozen=True)
class Timed:
  """One XLA operation's time in a trace, per step."""
  name: str  # the HLO instruction (a GPU kernel's `hlo_op`) or, failing that, the kernel's name
  group: str
  ms: float
  launches: float
  op_name: str = ''  # the jax operation it came from


_SKIP = ('ThreadpoolListener', 'ThunkExecutor', 'SlinkyThreadPool', 'end: ')
# A GPU plane's lines derived from its streams' kernels.
_DERIVED = ('XLA Modules', 'XLA Ops', 'Async XLA Ops', 'Host Offload Ops', 'Steps', 'Framework', 'Source', 'Launch',
            'TensorFlow', 'XLA TraceMe')


def _stats(event) -> dict:
  try:
    return {name: value for name, value in event.stats}
  except Exception:  # pylint: disable=broad-except  (a stat whose value this jax cannot decode)
    return {}


def timed_ops(xplane: str, hlo: str | Module, steps: int) -> list[Timed]:
  """The operations of a jax.profiler trace (`xplane`: its .xplane.pb) of `steps` steps of the program whose
  compiled HLO text is `hlo`, with their time and launches per step, costliest first (`timed_events`)."""
  import jax  # noqa: PLC0415  (the rest of this module reads text only)
  return timed_events(jax.profiler.ProfileData.from_file(xplane).planes, hlo, steps)


def timed_events(planes, hlo: str | Module, steps: int) -> list[Timed]:
  """`timed_ops` of a trace's planes (each with .name and .lines, a line with .name and .events, an event with
  .name, .duration_ns and .stats).

  On a GPU: the kernels and copies of the first GPU (the events of its lines 'Stream #N(...)', and any other event
  naming the HLO instruction it ran for, `hlo_op`; not the lines derived from them, nor CUPTI's own overhead),
  named by their `hlo_op`. On a CPU: the operations XLA:CPU's threads ran (run with
  XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true to record them). A ValueError if the trace holds none (on a GPU:
  CUPTI could not record the kernels).
  """
  planes = list(planes)
  gpus = sorted((p for p in planes if p.name.startswith('/device:GPU')), key=lambda p: p.name)
  chosen = [(p, True) for p in gpus[:1]] or [(p, False) for p in planes]  # one device's: each runs the step
  origin = where(hlo)
  ms, launches = collections.Counter(), collections.Counter()
  for plane, gpu in chosen:
    for line in plane.lines:
      if line.name.startswith(_DERIVED) if gpu else not line.name.startswith('tf_XLA'):  # not the Python thread
        continue
      stream = line.name.startswith('Stream #')
      for event in line.events:
        if not gpu and event.name.startswith(_SKIP):
          continue
        op = str(_stats(event).get('hlo_op', '')) if gpu else ''
        if gpu and not (op or stream):  # CUPTI's overhead, say
          continue
        name = op or event.name
        dotted = re.sub(r'_(\d+)$', r'.\1', name)  # a kernel named after its fusion: loop_add_fusion_3
        name = dotted if name not in origin and dotted in origin else name
        ms[name] += event.duration_ns / 1e6 / steps
        launches[name] += 1 / steps
  if not ms:
    raise ValueError(f'the trace holds no kernel of {gpus[0].name} (could CUPTI record them? see the log)' if gpus
                     else 'the trace holds no XLA operation (on a CPU, set XLA_FLAGS=--xla_cpu_enable_xprof_traceme='
                     'true)')
  return [Timed(name, group(origin.get(name, '')), t, launches[name], origin.get(name, ''))
          for name, t in ms.most_common()]


def by_group(ops: list[Timed]) -> dict[str, tuple[float, float]]:
  """{group: (ms, launches) per step}, costliest first."""
  ms, launches = collections.Counter(), collections.Counter()
  for op in ops:
    ms[op.group] += op.ms
    launches[op.group] += op.launches
  return {g: (t, launches[g]) for g, t in ms.most_common()}


def format_timed(ops: list[Timed], top: int = 15) -> str:
  """Time per step by group, then the costliest operations with the jax operation each came from."""
  groups = by_group(ops)
  total = sum(t for t, _ in groups.values())
  lines = [f'time per step by part of the step (kernels summed; {total:.2f} ms in all):',
           f'  {"group":10s} {"ms":>8s} {"share":>6s} {"launches":>9s}']
  for g, (t, n) in groups.items():
    lines.append(f'  {g:10s} {t:8.2f} {t / max(total, 1e-9):6.1%} {n:9.0f}')
  lines.append(f'costliest {top} operations, ms per step:')
  for op in ops[:top]:
    lines.append(f'  {op.ms:8.3f} x{op.launches:<4.0f} {op.group:9s} {op.name:32s} {op.op_name[-80:]}')
  return '\n'.join(lines)


_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 'bf16': 2, 'f16': 2, 's16': 2, 'u16': 2, 'f32': 4, 's32': 4, 'u32': 4,
          'f64': 8, 's64': 8, 'u64': 8}


def _shape_bytes(text: str) -> tuple[int, list[tuple[str, list[int]]]]:
  """(bytes, [(dtype, dims)]) of every array type in `text`, e.g. '(f32[4,2]{1,0}, bf16[3])'."""
  arrays = [(t, [int(d) for d in dims.split(',') if d]) for t, dims in re.findall(r'\b([a-z]+\d*)\[([\d,]*)\]', text)
            if t in _BYTES]
  total = 0
  for t, dims in arrays:
    n = 1
    for d in dims:
      n *= d
    total += n * _BYTES[t]
  return total, arrays


def roofline(hlo: str | Module, instructions: list[Instruction], bandwidth: float,
             peak_flops: float) -> dict[str, float]:
  """{instruction: seconds} that each kernel needs at least: the bytes it reads and writes at the memory's
  `bandwidth`, or its matmul FLOPs at `peak_flops`, whichever is more (a lower bound, not a prediction). A fusion
  that only slices an operand (a scanned layer's weights, its saved activations) reads the slices, and one that
  updates a slice in place writes the update, not the whole array."""
  module = read(hlo) if isinstance(hlo, str) else hlo
  out = {}
  for i in instructions:
    if i.kind == 'while':  # its body's kernels are timed on their own
      continue
    line = module.lines.get(i.name, '')
    args = re.search(r' [a-z][\w\-]*\((.*?)\)(?:, |$)', line)
    operands = re.findall(r'%([\w.\-]+)', args.group(1)) if args else []
    body = module.fused(i.name)
    sliced = _sliced_bytes(body) if body else {}
    result = module.shapes.get(i.name, '')
    if i.opcode.endswith('-start') and result.startswith('(('):  # ((its operands), its results, context)
      result = _elements(result)[1]
    moved = sliced.get(-1, _shape_bytes(result)[0]) + sum(
        sliced.get(k, _shape_bytes(module.shapes.get(n, ''))[0]) for k, n in enumerate(operands))
    flops = 0.0
    if ' dot(' in body:
      flops = _dot_flops(body)
    elif i.kind == 'cublas' or i.opcode == 'dot':
      flops = _dot_flops(line + '\n' + '\n'.join(f'%{o} = {module.shapes.get(o, "")} x()' for o in operands))
    out[i.name] = max(moved / bandwidth, flops / peak_flops)
  return out


def _elements(shape: str) -> list[str]:
  """The elements of a tuple type, e.g. '((f32[2]), f32[1], u32[])' -> ['(f32[2])', 'f32[1]', 'u32[]']."""
  elements, depth, start = [], 0, 1
  for index, char in enumerate(shape):
    depth += {'(': 1, '[': 1, '{': 1, ')': -1, ']': -1, '}': -1}.get(char, 0)
    if (char == ',' and depth == 1) or depth == 0:
      elements.append(shape[start:index].strip())
      start = index + 1
    if depth == 0:
      break
  return elements


def _sliced_bytes(body: str) -> dict[int, int]:
  """{operand index (-1: the result): bytes it moves} for what a fused computation's text touches only in part:
  a parameter read only by slices, directly or of its conversions (the slices' elements: a scanned layer's row of
  the stacked weights, a weight of optimizer.FlatParams' vectors cast to bfloat16), one updated in place by a
  dynamic-update-slice (nothing read), a result (or a result's tuple element) that is a dynamic-update-slice (its
  update's bytes)."""
  defs, params, uses, root = {}, {}, collections.defaultdict(list), ''
  for line in body.splitlines()[1:]:
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    name, shape, opcode = m.groups()
    if opcode == 'parameter':
      params[name] = int(re.search(r'parameter\((\d+)\)', line).group(1))
    args = re.search(rf' {re.escape(opcode)}\((.*?)\)(?:, |$)', line)
    operands = re.findall(r'%([\w.\-]+)', args.group(1)) if args else []
    defs[name] = (opcode, operands, shape)
    for position, operand in enumerate(operands):
      uses[operand].append((opcode, position, shape, name))
    if line.lstrip().startswith('ROOT'):
      root = name

  def sliced(name: str) -> int | None:  # elements of `name` read, if only by slices (of its conversions)
    read = 0
    for op, position, shape, user in uses[name]:
      if op in ('slice', 'dynamic-slice') and position == 0:
        read += math.prod(_shape_bytes(shape)[1][0][1])
      elif op in ('convert', 'bitcast') and (through := sliced(user)) is not None:
        read += through
      else:
        return None
    return read

  out = {}
  for name, index in params.items():
    elements = sliced(name) if uses[name] else None
    if elements is not None:
      out[index] = elements * _BYTES[_shape_bytes(defs[name][2])[1][0][0]]
    elif uses[name] and all(op == 'dynamic-update-slice' and pos == 0 for op, pos, _, _ in uses[name]):
      out[index] = 0

  def written(name: str) -> tuple[int, bool]:  # (bytes, whether only a slice of it)
    opcode, operands, shape = defs.get(name, ('', [], ''))
    if opcode == 'dynamic-update-slice':
      return _shape_bytes(defs.get(operands[1], ('', [], ''))[2])[0], True
    return _shape_bytes(shape)[0], False

  parts = [written(o) for o in defs[root][1]] if root and defs[root][0] == 'tuple' else [written(root)]
  if any(partial for _, partial in parts):
    out[-1] = sum(n for n, _ in parts)
  return out


def _dot_flops(body: str) -> float:
  """2 x output elements x contracted size, summed over the dots of a fused computation's text."""
  shapes = {m.group(1): m.group(2) for m in re.finditer(r'^\s*(?:ROOT )?%?([\w.\-]+) = (\S+?)(?:\{[\d,]*\})? ',
                                                         body, re.MULTILINE)}
  params = {m.group(1): m.group(2) for m in re.finditer(r'([\w.\-]+): ([a-z]+\d*\[[\d,]*\])', body)}
  shapes.update(params)
  total = 0.0
  for m in re.finditer(r'= (\S+) dot\(%?([\w.\-]+), .*?lhs_contracting_dims=\{([\d,]*)\}', body):
    out = _shape_bytes(m.group(1))[1]
    lhs = _shape_bytes(shapes.get(m.group(2), ''))[1]
    if not out or not lhs:
      continue
    n = 1
    for d in out[0][1]:
      n *= d
    k = 1
    for axis in (int(a) for a in m.group(3).split(',') if a):
      k *= lhs[0][1][axis]
    total += 2.0 * n * k
  return total


def against_roofline(ops: list[Timed], hlo: str | Module, bandwidth: float,
                     peak_flops: float) -> list[tuple[Timed, str, float]]:
  """Each traced operation of `ops` (timed_ops of the program `hlo`) with the kind of kernel it is and the least
  time its launches in a step need (`roofline` at `bandwidth` and `peak_flops`, in ms), the farthest from it first:
  where a step's kernels lose time against what their bytes and FLOPs allow. An operation the program does not name
  (a copy the runtime adds) is of kind 'not in the program', with no least time."""
  module = read(hlo) if isinstance(hlo, str) else hlo
  found = {i.name: i for i in parse(module)}
  least = roofline(module, list(found.values()), bandwidth, peak_flops)
  rows = [(op, found[op.name].kind if op.name in found else 'not in the program',
           least.get(op.name, 0.0) * 1e3 * op.launches) for op in ops]
  return sorted(rows, key=lambda row: row[2] - row[0].ms)


def by_kind(rows: list[tuple[Timed, str, float]]) -> dict[str, tuple[float, float]]:
  """{kind of kernel: (ms measured, least ms)} per step of against_roofline's rows, the most measured first."""
  measured, least = collections.Counter(), collections.Counter()
  for op, kind, ms in rows:
    measured[kind] += op.ms
    least[kind] += ms
  return {k: (t, least[k]) for k, t in measured.most_common()}


def format_roofline(rows: list[tuple[Timed, str, float]], top: int = 10) -> str:
  """The time per kind of kernel against its least time, then the operations farthest from theirs."""
  lines = ['kernels against their least time (bytes at the memory\'s bandwidth or matmul FLOPs at the peak), ms per '
           'step:', f'  {"kind":28s} {"measured":>9s} {"least":>8s} {"least/measured":>15s}']
  for kind, (ms, least) in by_kind(rows).items():
    lines.append(f'  {kind:28s} {ms:9.3f} {least:8.3f} {least / max(ms, 1e-9):15.1%}')
  lines.append(f'the {top} operations farthest from their least time, ms per step:')
  for op, kind, least in rows[:top]:
    lines.append(f'  {op.ms:8.3f} {least:8.3f} x{op.launches:<4.0f} {kind:7s} {op.name:32s} {op.op_name[-70:]}')
  return '\n'.join(lines)
