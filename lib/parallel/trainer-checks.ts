// ParallelTrainer.create's local checks of the model, the parameter groups and the options (moved
// out of trainer.ts unchanged): every problem named in one ArgumentError.
import { ArgumentError } from '../errors.js';
import type { Parameter } from '../nn/module.js';
import { moeLayers } from '../nn/moe.js';
import type { Tensor } from '../tensor.js';
import type { PipelineModule } from './pipeline/gpt-stage.js';
import { SCHEDULE_KINDS } from './pipeline/schedules.js';
import { layoutProblems, type LayoutRequest } from './layout.js';
import { tensorParallelParameters } from './tensor-parallel/gpt.js';
import type { ParallelTrainerOptions } from './trainer.js';
import type { ZeroParamGroup } from './zero/optimizer.js';

/** The trainer's local checks; throws an ArgumentError naming every problem. */
export function checkTrainerSetup<H extends { lr: number }>(model: PipelineModule, paramGroups: ZeroParamGroup<H>[], options: ParallelTrainerOptions<H>): void {
  const problems: string[] = [];
  const { mesh } = options;
  const zero = options.zero ?? 0, m = options.microBatches ?? 1, schedule = options.schedule ?? '1f1b';
  const chunks = model.chunks ?? 1, placement = model.placement ?? 'loop';
  // The layout rules (the same book the command-line flags and the planner check) over what this
  // rank knows: the mesh, the options, the model's chunks and its MoE layers.
  const moe = moeLayers(model);
  const layout = { tp: mesh?.tpSize ?? 1, pp: mesh?.ppSize ?? 1, dp: mesh?.dpSize ?? 1, cp: mesh?.cpSize ?? 1, ep: mesh?.epSize ?? 1,
    zero, offload: options.offload ?? false, sequenceParallel: false, microBatches: m, schedule, virtualStages: chunks, cpMode: options.cpMode ?? 'ring' } as LayoutRequest;
  problems.push(...layoutProblems(moe.length > 0 ? { moeExperts: moe[0]!.config.experts } : {}, layout));
  // Whether the model's chunks are placed as the schedule runs them (the V for zb-v, a loop otherwise).
  if (schedule === 'zb-v' && (chunks !== 2 || placement !== 'v')) problems.push('the zb-v schedule needs a model of 2 chunks per stage placed in a V (GPTStage(model, stage, stages, 2, \'v\'))');
  else if (schedule !== 'zb-v' && (SCHEDULE_KINDS as readonly string[]).includes(schedule) && placement !== 'loop') problems.push(`a model whose chunks are placed '${placement}' needs the zb-v schedule, not '${schedule}'`);
  const precision = options.precision ?? 'f32';
  if (precision !== 'f32' && precision !== 'bf16') {
    problems.push(`precision must be 'f32' or 'bf16', got ${String(precision)}${precision === 'f16' ? ' (f16 needs loss scaling: run nt.autocast({ dtype: \'f16\' }) with nt.GradScaler in your own loop)' : ''}`);
  }
  const stages = mesh?.ppSize ?? 1, stage = mesh?.ppRank ?? 0;
  // Under the V placement the first stage also computes the loss.
  if (model.isFirstStage !== (stage === 0) || model.isLastStage !== (placement === 'v' ? stage === 0 : stage === stages - 1)) {
    problems.push(`the model is ${model.isFirstStage ? 'a first' : 'not a first'} and ${model.isLastStage ? 'a last' : 'not a last'} stage, but this rank is pipeline stage ${stage} of ${stages}`);
  }
  if (mesh && mesh.tpSize > 1 && tensorParallelParameters(model).sharded.length === 0) {
    problems.push(`tp = ${mesh.tpSize}, but the model has no tensor-parallel layers (every rank would hold and train the whole model)`);
  }
  const named = new Map(model.namedParameters().map(([n, p]) => [p, n] as const));
  const listed = new Set<Tensor>();
  for (const g of paramGroups) {
    for (const p of g.params) {
      if (listed.has(p)) problems.push(`${named.get(p as Parameter) ?? p.describe()} is in the parameter groups twice`);
      else if (!named.has(p as Parameter)) problems.push(`the parameter groups hold ${p.describe()}, which is not one of the model's parameters`);
      listed.add(p);
    }
  }
  if (mesh && mesh.epSize > 1) {
    const layers = moe;
    if (layers.length > 0 && layers.some((l) => l.experts.length * mesh.epSize !== l.config.experts)) {
      problems.push(`ep = ${mesh.epSize}, but the MoE layers hold ${layers[0]!.experts.length} of their ${layers[0]!.config.experts} experts here: ` +
        'build the model with moeParallel: nt.parallel.ep.expertParallel({ experts, epGroup: mesh.epGroup, countGroup: mesh.dpGroup })');
    }
  }
  const missing = [...named].filter(([p]) => !listed.has(p)).map(([, n]) => n);
  if (missing.length > 0) problems.push(`the model's parameter(s) ${missing.join(', ')} are in no parameter group, so the optimizer would never update them`);
  if (problems.length > 0) throw new ArgumentError(`ParallelTrainer: ${problems.join('; ')}`);
}
