// ParallelTrainer.create's local checks of the model, the parameter groups and the options (moved
// out of trainer.ts unchanged): every problem named in one ArgumentError.
import { ArgumentError } from '../errors.js';
import type { Parameter } from '../nn/module.js';
import { moeLayers } from '../nn/moe.js';
import type { Tensor } from '../tensor.js';
import type { PipelineModule } from './pipeline/gpt-stage.js';
import { SCHEDULE_KINDS, splitsBackward } from './pipeline/schedules.js';
import { tensorParallelParameters } from './tensor-parallel/gpt.js';
import type { ParallelTrainerOptions } from './trainer.js';
import type { ZeroParamGroup } from './zero/optimizer.js';

/** The trainer's local checks; throws an ArgumentError naming every problem. */
export function checkTrainerSetup<H extends { lr: number }>(model: PipelineModule, paramGroups: ZeroParamGroup<H>[], options: ParallelTrainerOptions<H>): void {
  const problems: string[] = [];
  const { mesh } = options;
  const zero = options.zero ?? 0, m = options.microBatches ?? 1, schedule = options.schedule ?? '1f1b';
  if (zero !== 0 && zero !== 1 && zero !== 2 && zero !== 3) problems.push(`zero must be 0, 1, 2 or 3, got ${String(zero)}`);
  if (zero !== 0 && (!mesh || mesh.dpCpGroup.size === 1)) problems.push(`ZeRO ${zero} shards over a data-parallel group of more than one rank`);
  const cpMode = options.cpMode ?? 'ring';
  if (cpMode !== 'ring' && cpMode !== 'ulysses') problems.push(`cpMode must be 'ring' or 'ulysses', got ${String(cpMode)}`);
  if (!Number.isInteger(m) || m < 1) problems.push(`microBatches must be an integer >= 1, got ${m}`);
  const chunks = model.chunks ?? 1, placement = model.placement ?? 'loop';
  if (!(SCHEDULE_KINDS as readonly string[]).includes(schedule)) problems.push(`schedule must be one of ${SCHEDULE_KINDS.map((k) => `'${k}'`).join(', ')}, got ${String(schedule)}`);
  else if (schedule === 'zb-v') {
    if (chunks !== 2 || placement !== 'v') problems.push('the zb-v schedule needs a model of 2 chunks per stage placed in a V (GPTStage(model, stage, stages, 2, \'v\'))');
    if ((mesh?.ppSize ?? 1) < 2) problems.push('the zb-v schedule needs 2 or more pipeline stages');
  } else if (placement !== 'loop') problems.push(`a model whose chunks are placed '${placement}' needs the zb-v schedule, not '${schedule}'`);
  else if (schedule === 'interleaved') {
    const stages = mesh?.ppSize ?? 1;
    if (chunks < 2) problems.push('the interleaved schedule needs a model of 2 or more chunks per stage (GPTStage(model, stage, stages, chunks))');
    if (stages < 2) problems.push('the interleaved schedule needs 2 or more pipeline stages');
    else if (Number.isInteger(m) && m % stages !== 0) problems.push(`the interleaved schedule needs the micro-batches to be a multiple of the pipeline stages (as Megatron-LM requires): ${m} micro-batches over ${stages} stages`);
  } else if (chunks > 1) problems.push(`a model of ${chunks} chunks per stage needs the interleaved schedule, not '${schedule}'`);
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
  if (mesh && mesh.epSize > 1 && splitsBackward(schedule) && (zero === 2 || zero === 3)) {
    problems.push(`the ${schedule} schedule with expert parallelism (ep = ${mesh.epSize}) and ZeRO ${zero} is not supported yet (the experts' ZeRO would reduce before each W): use ZeRO 0 or 1`);
  }
  if (mesh && mesh.epSize > 1) {
    const layers = moeLayers(model);
    if (layers.length === 0) problems.push(`ep = ${mesh.epSize}, but the model has no MoE layers to split`);
    else if (layers.some((l) => l.experts.length * mesh.epSize !== l.config.experts)) {
      problems.push(`ep = ${mesh.epSize}, but the MoE layers hold ${layers[0]!.experts.length} of their ${layers[0]!.config.experts} experts here: ` +
        'build the model with moeParallel: nt.parallel.expertParallel({ experts, epGroup: mesh.epGroup, countGroup: mesh.dpGroup })');
    }
  }
  const missing = [...named].filter(([p]) => !listed.has(p)).map(([, n]) => n);
  if (missing.length > 0) problems.push(`the model's parameter(s) ${missing.join(', ')} are in no parameter group, so the optimizer would never update them`);
  if (problems.length > 0) throw new ArgumentError(`ParallelTrainer: ${problems.join('; ')}`);
}
