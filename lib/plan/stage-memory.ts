// One pipeline stage's memory: the published bf16 recipe (Korthikanti et al.'s activations, the
// ZeRO paper's states) and nodetron's own training, as the largest of the moments (phases) of its step.
import { ArgumentError } from '../errors.js';
import { LINEAR_CE_CHUNK_BYTES, LINEAR_CE_CUDA_CHUNK_BYTES, linearCrossEntropyChunkRows } from '../ops/linear-cross-entropy.js';
import { largestLayerParams, layerParams, moeLayerCount, stageExpertParams, stageParams, type PlanModel } from './models.js';
import { schedulePlacement, splitsBackward } from '../parallel/pipeline/schedules.js';
import type { MemoryEstimate, MemoryOptions, PlanLayout, Recompute } from './memory.js';
import { inFlightMicroBatches, scheduleStates, type ScheduleState } from './schedule-states.js';
import { BF16_PROFILE, cpuBf16Path, F32_DEFERRED_REPLICATED, F32_DEFERRED_SPLIT, F32_PROFILE, F32_SCORES, sizeClass, type TensorCounts } from './precision.js';

/**
 * Korthikanti et al. 2022 (Table 2), bytes of one layer's activations in 16-bit training for a
 * micro-batch of b sequences of s tokens: sbh(34 + 5as/h) without parallelism; with tensor
 * parallelism t sbh(10 + 24/t + 5as/(ht)); with sequence parallelism too sbh(34/t + 5as/(ht));
 * selective recomputation drops the 5as/h attention-core term; full recomputation keeps 2sbh (the
 * layer's input; /t under sequence parallelism). The MLP's share (16 of 24) scales with ffn/(4h),
 * ×1.5 for a gated MLP, as Megatron's theoretical_memory_usage.py scales 18 + 4·ffn/h.
 */
export function korthikantiLayerBytes(m: PlanModel, s: number, b: number, t: number, sp: boolean, recompute: Recompute): number {
  const h = m.nEmbd, a = m.nHead;
  const mlp = 16 * (m.ffn / (4 * h)) * (m.gated ? 1.5 : 1);
  const split = 8 + mlp, replicated = 10;
  const sbh = s * b * h;
  if (recompute === 'full') return (2 * sbh) / (sp ? t : 1);
  const core = recompute === 'selective' ? 0 : (5 * a * s) / (h * t);
  return sbh * ((sp ? replicated / t : replicated) + split / t + core);
}

function bucketBytesOf(o: MemoryOptions): number { return o.bucketBytes ?? 25 * 2 ** 20; }

/**
 * Context parallelism's communication buffers in one layer's attention, for sl local tokens of b
 * sequences and hl = h/tp channels per rank, w bytes per element. Ring: the key/value block held and
 * the one arriving ([k|v] × sl·b·hl each), in backward with their two gradient accumulators and the
 * block's scratch gradients (4 more). Ulysses: the all-to-all's send and receive copies of q, k, v
 * (2 × 3 × sl·b·hl).
 */
export function contextBuffers(layout: PlanLayout, sl: number, b: number, hl: number, w: number): number {
  const cp = layout.cp ?? 1;
  if (cp === 1) return 0;
  const block = sl * b * hl * w;
  return (layout.cpMode ?? 'ring') === 'ring' ? 8 * block : 6 * block;
}

function checkLayout(m: PlanModel, l: PlanLayout, o: MemoryOptions): void {
  const bad: string[] = [];
  for (const k of ['dp', 'tp', 'pp', 'microBatches'] as const) if (!Number.isInteger(l[k]) || l[k] < 1) bad.push(`${k} must be an integer >= 1`);
  if (!Number.isInteger(o.seq) || o.seq < 1 || !Number.isInteger(o.microBatchSize) || o.microBatchSize < 1) bad.push('seq and microBatchSize must be integers >= 1');
  if (l.pp > m.nLayer) bad.push(`pp ${l.pp} exceeds the ${m.nLayer} layers`);
  if (o.model !== undefined && o.model !== 'nodetron' && o.model !== 'megatron') bad.push(`model must be 'nodetron' or 'megatron', got ${JSON.stringify(o.model)}`);
  else if (o.model === 'megatron' && o.dtype === 'f32') bad.push('model \'megatron\' is the published bf16 recipe; f32 is estimated for nodetron only');
  if (o.backend !== undefined && o.backend !== 'cpu' && o.backend !== 'cuda') bad.push(`backend must be 'cpu' or 'cuda', got ${JSON.stringify(o.backend)}`);
  if (o.bf16Path !== undefined && o.bf16Path !== 'native' && o.bf16Path !== 'widen') bad.push(`bf16Path must be 'native' or 'widen', got ${JSON.stringify(o.bf16Path)}`);
  else if (o.bf16Path === 'widen' && (o.backend ?? (o.dtype === 'f32' ? 'cpu' : 'cuda')) === 'cuda') bad.push("bf16Path 'widen' is the cpu backend's fallback; cuda runs bf16 GEMMs natively");
  if (bad.length) throw new ArgumentError(`estimateMemory: ${bad.join('; ')}`);
}

/** The memory of one pipeline stage's rank (tensor-parallel rank 0, data-parallel rank 0). */
export function estimateStageMemory(m: PlanModel, layout: PlanLayout, opts: MemoryOptions, stage: number): MemoryEstimate {
  checkLayout(m, layout, opts);
  const { tp: t, pp, dp, zero } = layout;
  const ep = layout.ep ?? 1;
  const sp = layout.sequenceParallel && t > 1;
  // zb-v's V: stage 0 holds both ends of the model, every stage a chunk on the way down and one back.
  const placement = schedulePlacement(layout.schedule);
  const sp_ = stageParams(m, t, pp, stage, ep, placement);
  const psi = sp_.total;
  // The routed experts held here (1/ep of them): ZeRO shards them over the dp/ep ranks holding the same experts.
  const expertPsi = stageExpertParams(m, pp, stage, ep);
  const first = stage === 0, last = placement === 'v' ? stage === 0 : stage === pp - 1;
  const nLayers = sp_.layers;
  // Context parallelism: this rank's tokens of each sequence; ZeRO shards over the dp × cp ranks.
  const cp = layout.cp ?? 1;
  const s = opts.seq / cp, b = opts.microBatchSize, h = m.nEmbd;
  const inFlight = inFlightMicroBatches(layout, stage);
  const shard = Math.ceil((psi - expertPsi) / (dp * cp)) + Math.ceil(expertPsi / (dp / ep));
  const f32 = opts.dtype === 'f32';
  const w = f32 ? 4 : 2;
  const published = !f32 && (opts.model ?? 'megatron') === 'megatron';
  // Expert parallelism: the running MoE layer's routed rows, sent to the experts' ranks and received back.
  const moeLayersHere = m.moe ? nLayers * (moeLayerCount(m) / m.nLayer) : 0;
  const allToAll = ep > 1 && moeLayersHere > 0 ? 2 * s * b * m.moe!.topK * h * w : 0;
  const moeFields = m.moe ? { expertParams: expertPsi, allToAll } : {};
  // The published recipe keeps 16-bit weights and gradients beside a 12-byte optimizer state; nodetron
  // keeps f32 weights and gradients in both precisions (autocast casts the weights per forward).
  const K = opts.optimizerBytesPerParam ?? (published ? 12 : 8);
  const stateW = published ? 2 : 4;
  // ZeRO (Rajbhandari et al. 2020): (2 + 2 + K)Ψ, sharding K from stage 1, gradients from 2, weights at 3.
  const params = stateW * (zero === 3 ? shard : psi);
  let grads = stateW * (zero >= 2 ? shard : psi);
  let optimizerState = K * (zero >= 1 ? shard : psi);
  let hostBytes = 0;
  if (layout.offload && zero > 0) {
    hostBytes = optimizerState + (zero >= 2 ? grads : 0);
    optimizerState = 0;
    if (zero >= 2) grads = 0;
  }
  let activations: number, logits = 0, buffers = 0;
  // The fused head sees every row of the micro-batch (sequence parallelism gathers them) over the
  // vocabulary held here, LINEAR_CE_CHUNK_BYTES of logits at a time.
  const localVocab = m.vocabSize / t;
  const chunkElems = (bytes: number) => linearCrossEntropyChunkRows(s * b, localVocab, bytes) * localVocab;
  if (published) {
    // Context parallelism keeps one more [s/cp, b, h/t] tensor per layer (ring: the compact queries;
    // Ulysses: the head-sharded output beside the merged one).
    const layer = korthikantiLayerBytes(m, s, b, t, sp, layout.recompute) + (cp > 1 && layout.recompute !== 'full' ? (w * s * b * h) / t : 0);
    // Megatron (theoretical_memory_usage.py): the embedding's dropout output sbh·2 bytes per in-flight micro-batch,
    // its input ids 8sb; under full recomputation, one layer's activations rebuilt during its backward.
    activations = inFlight * (nLayers * layer + (first ? (2 * s * b * h) / (sp ? t : 1) + 8 * s * b : 0));
    // ZB-H1: the micro-batches between B and W keep their linear layers' inputs and output gradients (16-bit).
    if (splitsBackward(layout.schedule) && pp > 1 && layout.recompute !== 'full') {
      const deferred = Math.max(...scheduleStates(layout, stage).map((x) => x.deferred));
      activations += deferred * nLayers * 2 * s * b * h * (F32_DEFERRED_REPLICATED / (sp ? t : 1) + F32_DEFERRED_SPLIT / t);
    }
    if (layout.recompute === 'full' && nLayers > 0) activations += korthikantiLayerBytes(m, s, b, t, sp, 'none');
    // The last stage's fused head: one chunk of 16-bit logits (overwritten by its gradient), its fp32
    // copy for the weight gradient, which accumulates over the chunks in an fp32 [V/t, h] buffer.
    if (last) logits = chunkElems(2) * (2 + 4) + 4 * localVocab * h;
    if (dp * cp > 1) buffers += 2 * bucketBytesOf(opts); // a bucket being filled and one in flight
    buffers += contextBuffers(layout, s, b, h / t, w);
    // ZeRO-3 gathers a layer before use and prefetches the next: DeepSpeed counts 4 bytes per parameter of the largest layer.
    if (zero === 3) buffers += 4 * Math.min(largestLayerParams(m), psi) / t;
    buffers += allToAll;
    const subtotal = params + grads + optimizerState + activations + logits + buffers;
    const overhead = subtotal * ((opts.overhead ?? 1.1) - 1);
    return { stage, numParams: psi, params, grads, optimizerState, activations, logits, buffers, overhead, total: subtotal + overhead, hostBytes, inFlight, ...moeFields };
  }
  // f32 on nodetron's CPU allocator (measured with `nodetron plan --calibrate`). The peak is the
  // largest of these moments of a step:
  // - the forward of a micro-batch (every stage but the last): the in-flight micro-batches' saved
  //   tensors, the running forward's unsaved intermediates, and every gradient when an earlier
  //   micro-batch's backward has made them (1F1B with m > pp − stage; accumulation without a pipeline);
  // - the fused head on the last stage (the head runs inside the forward): the above, one chunk of
  //   logits, and the head's gradients it makes in the forward (the [V/tp, h] table's and the
  //   input's), held until the micro-batch's backward;
  // - a backward on a later pipeline stage: the gradients beside the in-flight micro-batches' saved
  //   tensors (a middle stage's peak under GPipe);
  // - the end of the first stage's backward: every gradient and the token table's dense [V/tp, h]
  //   gradient before it is added, with the activations of the micro-batches still in flight.
  const sc = sizeClass;
  const P = f32 ? F32_PROFILE : BF16_PROFILE;
  const backend = opts.backend ?? (f32 ? 'cpu' : 'cuda');
  // A [V/tp, h] table at the head's element size: the table gradient the head makes in its forward;
  // in 16 bits also the size of autocast's copy of the table.
  const headTable = sc((P.headBytes * m.vocabSize * h) / t);
  const unitRep = (4 * s * b * h) / (sp ? t : 1);
  // Elements of a whole-width and of a split s·b·h tensor, and the bytes of `c` such tensors of each kind.
  const eRep = (s * b * h) / (sp ? t : 1), eSplit = (s * b * h) / t;
  const n = (c: TensorCounts, elems: number) => c.f32 * sc(4 * elems) + c.half * sc(2 * elems);
  const scores = 4 * b * (m.nHead / t) * s;
  // Context parallelism keeps one more [s/cp, b, h/t] tensor per layer (ring: the compact queries;
  // Ulysses: the head-sharded output beside the merged one).
  const fullLayer = n(P.blockReplicated, eRep) + n(P.blockSplit, eSplit) + F32_SCORES * sc(scores) + (cp > 1 ? n(P.contextLayer, eSplit) : 0);
  const storedLayer = layout.recompute === 'full' ? sc(unitRep) : fullLayer;
  // Each in-flight micro-batch's saved tensors (1F1B: min(pp − stage, m); GPipe: m; no pipeline: one),
  // and the s·b·h tensors outside its blocks (F32_EMBEDDING without a pipeline; F32_STAGE_OUTSIDE in one).
  const outside = n(pp === 1 ? P.embedding : P.stageOutside[first ? 'first' : last ? 'last' : 'middle'], eRep);
  // Under autocast each micro-batch's forward casts the layers' weights once (16-bit), and its ops
  // save the copies for backward (a recomputed block casts them again in its backward).
  const weightCopies = layout.recompute === 'full' ? 0 : P.weightCopyBytes * sp_.layerParams;
  const perHeld = nLayers * storedLayer + outside + weightCopies;
  // ZB-H1: between a micro-batch's B and its W the linear layers keep their inputs (2 whole-width and
  // 5 split s·b·h tensors per block), their output gradients (2 whole and 7 split: the QKV's, the
  // projections', the MLP's pre-GELU one) and the MLP's pre-GELU value (4 split); the rest of its saved
  // tensors went with B. Recomputed blocks compute every gradient in B.
  // On the last stage the fused head's [V/tp, h] weight gradient, made in the forward, waits for W too.
  const perDeferred = (layout.recompute === 'full' ? 0 : nLayers * (n(P.deferredReplicated, eRep) + n(P.deferredSplit, eSplit)))
    + (last ? headTable : 0);
  const standard = layout.schedule === 'gpipe' || layout.schedule === '1f1b' || pp === 1;
  const states = standard ? [] : scheduleStates(layout, stage);
  const stateActivations = (x: ScheduleState) => x.held * perHeld + x.deferred * perDeferred;
  const worst = standard ? null : states.reduce((a, x) => (stateActivations(x) + x.posted * sc(unitRep) > stateActivations(a) + a.posted * sc(unitRep) ? x : a));
  const held = worst ? Math.max(...states.map((x) => x.held)) : inFlightMicroBatches(layout, stage);
  activations = worst ? stateActivations(worst) : held * perHeld;
  // Gradients are alive from a micro-batch's first backward to the optimizer step (zeroGrad frees them).
  // ZeRO 1/2 keep an fp32 master shard.
  const accumulating = pp > 1 || layout.microBatches > 1;
  const allGrads = 4 * (zero >= 2 ? shard : psi);
  grads = accumulating ? allGrads : 0;
  // A forward after this stage's first backward: 1F1B runs pp − stage − 1 warm-up forwards, then one
  // forward and one backward; GPipe runs every forward first.
  const gradsInForward = (pp === 1 || layout.schedule === '1f1b') && layout.microBatches > pp - stage;
  if (zero === 1 || zero === 2) buffers += 4 * shard;
  buffers += contextBuffers(layout, s, b, h / t, w) + allToAll;
  // ZeRO 3 keeps the embeddings, final norm and tied head gathered from the forward to the step.
  const table = (4 * m.vocabSize * h) / t;
  if (zero === 3) buffers += sc(table) + 4 * (sp_.embedding + sp_.head - (first ? table / 4 : 0) - (last && !first ? table / 4 : 0));
  // The head's logits block; in 16 bits over several chunks also the f32 accumulator of the table's
  // gradient, and autocast's 16-bit copy of the table, alive until the forward ends.
  const budget = backend === 'cuda' ? LINEAR_CE_CUDA_CHUNK_BYTES : LINEAR_CE_CHUNK_BYTES;
  const headRows = linearCrossEntropyChunkRows(s * b, localVocab, P.headBytes, budget);
  // bf16 on the cpu fallback ('widen'): a GEMM of op(A) [r, k], op(B) [k, n], C [r, n] makes f32 copies
  // of its 16-bit A, B and C (native/cpu/kernels/gemm.cc, F32View), alive while it runs. A linear
  // layer's forward and its two backward GEMMs (dX = dY·W, dW = dYᵀ·X) copy the same three sizes (the
  // weight's 16-bit autocast copy among them); the head's three per chunk the x rows, the [V/tp, h]
  // table and the [rows, V/tp] logits block or its gradient. The largest of a block's linear layers
  // (QKV, attention projection, MLP up and down) counts where a block's GEMM runs, the head's at the head.
  const widen = !f32 && (opts.bf16Path ?? (backend === 'cpu' ? cpuBf16Path() : 'native')) === 'widen';
  const gemmViews = (r: number, k: number, c: number) => sc(4 * r * k) + sc(4 * k * c) + sc(4 * r * c);
  const blockViews = widen && nLayers > 0
    ? Math.max(gemmViews(s * b, h, (3 * h) / t), gemmViews(s * b, h / t, h), gemmViews(s * b, h, m.ffn / t), gemmViews(s * b, m.ffn / t, h))
    : 0;
  const headViews = widen && last ? gemmViews(headRows, h, localVocab) : 0;
  const tableGrad = sc(table);
  const chunk = sc(P.headBytes * headRows * localVocab)
    + (P.headBytes === 2 ? (headRows < s * b ? sc(table) : 0) + headTable : 0);
  // The head's forward: each micro-batch whose head ran and whose backward has not holds its table
  // and input gradients; the one running holds a chunk of logits. Under GPipe every forward comes
  // before any backward (no gradients yet); under 1F1B or accumulation later heads meet them.
  const headGrads = headTable + sc(P.headBytes * s * b * h);
  // The running micro-batch's forward has not ended: its blocks' unsaved intermediates are alive
  // (a recomputed block keeps none).
  // Ulysses saves the whole-sequence q, k, v it gathered instead of this rank's, which then stays until the forward ends (3 more).
  const ulyssesTransient = cp > 1 && layout.cpMode === 'ulysses' ? n(P.ulyssesTransient, eSplit) : 0;
  const transient = layout.recompute === 'full' ? 0 : nLayers * (n(P.transientReplicated, eRep) + n(P.transientSplit, eSplit) + ulyssesTransient);
  const laterHead = last && accumulating && !(pp > 1 && layout.schedule === 'gpipe');
  interface Phase { grads: number; activations: number; logits: number; buffers: number }
  const phases: Phase[] = [];
  // The head's gradients wait per micro-batch in flight on the last chunk (all of them but under interleaving).
  const headHeld = standard ? held : Math.max(...states.map((x) => x.lastChunk));
  if (standard) {
    if (last) phases.push({ grads: laterHead ? grads : 0, activations, logits: chunk, buffers: headHeld * headGrads + transient + headViews });
    else phases.push({ grads: gradsInForward ? allGrads : 0, activations, logits: 0, buffers: transient + blockViews });
  } else {
    // Interleaved and ZB-H1: each forward of the table with what is held then (the last stage's head
    // on its last chunk; interleaving's posted receives; the gradients once a backward has run).
    for (const x of states) {
      const posted = x.posted * sc(unitRep);
      if (last && x.onLastChunk) phases.push({ grads: x.afterBackward ? grads : 0, activations: stateActivations(x), logits: chunk, buffers: x.lastChunk * headGrads + transient + posted + headViews });
      else phases.push({ grads: x.afterBackward ? allGrads : 0, activations: stateActivations(x), logits: 0, buffers: transient + posted + blockViews });
    }
  }
  // A backward on a later stage: the other in-flight micro-batches' saved tensors beside the running
  // one's, whose layers free their activations as their gradients appear (last layer first): at worst
  // every gradient with the first layer's activations, or one layer's gradients with all of them.
  if (pp > 1 && !first) {
    const perMicroBatch = held > 0 ? activations / held : 0;
    const layerGrads = (4 * layerParams(m, t, ep)) / (zero >= 2 ? dp : 1);
    const running = Math.max(allGrads + storedLayer + outside, Math.min(allGrads, layerGrads) + perMicroBatch);
    phases.push({ grads: allGrads, activations: (held - 1) * perMicroBatch + running - allGrads, logits: 0, buffers: blockViews });
  }
  // The end of the first stage's backward of a micro-batch, when the embedding makes the token
  // table's dense gradient. Without a pipeline the head's gradient of the tied table is already
  // there, so the new one is a second [V/tp, h] tensor until it is added; the activations are freed.
  // In a pipeline the first stage has no head: the first micro-batch's table gradient becomes .grad,
  // each later one is added to it, beside the micro-batches still in flight after that backward.
  // In 16 bits the head's 16-bit table gradient, handed to backward, is still held then (its f32 cast is in grads).
  if (first && pp === 1) phases.push({ grads: allGrads, activations: 0, logits: 0, buffers: tableGrad + (P.headBytes === 2 ? headTable : 0) });
  else if (first) {
    const perMicroBatch = held > 0 ? activations / held : 0;
    // After the k-th backward: 1F1B runs w = min(pp − 1, m) warm-up forwards, then each of its first
    // m − w backwards follows a forward (w stay in flight), then the cool-down drains them; GPipe is w = m.
    const mb = layout.microBatches;
    const w = layout.schedule === 'gpipe' ? mb : Math.min(pp - 1, mb);
    // Interleaved and ZB-H1: as many as the table holds at its peak, less the one just done.
    const after = standard ? (k: number) => (k < mb - w ? w : mb - 1 - k) : (k: number) => Math.max(0, held - (k + 1) / (layout.virtualStages ?? 1));
    phases.push({ grads: allGrads, activations: after(0) * perMicroBatch, logits: 0, buffers: 0 });
    if (mb > 1) phases.push({ grads: allGrads, activations: after(1) * perMicroBatch, logits: 0, buffers: tableGrad });
  }
  const sum = (p: Phase) => p.grads + p.activations + p.logits + p.buffers;
  // The first of equal phases wins (the forward's breakdown).
  const peak = phases.reduce((a, p) => (sum(p) > sum(a) ? p : a));
  // Full recomputation: one layer's activations rebuilt in its backward (after the head is done).
  const headPhase = last ? headHeld * headGrads + chunk + transient + headViews : 0;
  const recomputeExtra = layout.recompute === 'full' && nLayers > 0 ? Math.max(0, fullLayer + 4 * psi - headPhase) : 0;
  activations = peak.activations + recomputeExtra;
  logits = peak.logits;
  buffers += peak.buffers;
  // The allocator's size classes round the weights and each of Adam's two moments, and the token
  // table's [V/tp, h] gradient (the other gradients are small tensors; ZeRO 2/3 shard them flat).
  const tables = (first ? 1 : 0) + (last && !(first && m.tied) ? 1 : 0);
  const gradRounding = peak.grads > 0 && zero < 2 ? tables * (tableGrad - table) : 0;
  const rounding = sc(params) - params + (optimizerState > 0 ? 2 * sc(optimizerState / 2) - optimizerState : 0) + gradRounding;
  // On cuda a factor for the caching allocator's fragmentation and workspaces (an assumption).
  const factor = backend === 'cuda' ? (opts.overhead ?? 1.1) - 1 : 0;
  const overhead = rounding + factor * (params + peak.grads + optimizerState + activations + logits + buffers + rounding);
  const total = params + peak.grads + optimizerState + activations + logits + buffers + overhead;
  return { stage, numParams: psi, params, grads: peak.grads, optimizerState, activations, logits, buffers, overhead, total, hostBytes, inFlight: held, ...moeFields };
}
