// Stand-ins of the device run's cuda-only calls for the dry run (NODETRON_GPU_RUN_DRY=1), so the JavaScript
// of every device-only block of correctness.mjs and performance.mjs runs here against the cpu backend:
// streams and events that order nothing (the cpu backend runs each op to completion) and time with the
// host clock, and cuBLASLt's gemm_epilogue composed of cpu ops. What they cannot stand for (stream
// ordering, the epilogues' own arithmetic) is what only the GPU run checks.
import { performance } from 'node:perf_hooks';

/** nt.cuda's stream and event API as the cpu sees it: every op already done, so each wait is a no-op. */
export function cpuStreams() {
  class Stream {
    query() { return true; }
    synchronize() {}
    waitEvent() {}
    waitStream() {}
    destroy() {}
  }
  class Event {
    constructor(_device = 0, opts = {}) { this.timing = Boolean(opts.timing); this.t = undefined; }
    record() { this.t = performance.now(); return this; }
    query() { return this.t !== undefined; }
    synchronize() {}
    elapsedMs(end) { return end.t - this.t; }
    destroy() {}
  }
  const main = new Stream();
  return {
    Stream, Event,
    newStream: () => new Stream(),
    currentStream: () => main,
    withStream: (_s, fn) => fn(),
    synchronize: () => {},
    recordStream: () => {},
  };
}

/**
 * gemm_epilogue(a, b, c, dtype, batch, M, N, K, transA, transB, alpha, beta, ..., bias, epilogue, aux, cDtype)
 * as its tensors' composition on the cpu, for one [M, K] x [K, N] product (batch 1) with epilogues 3
 * (GELU_AUX_BIAS: aux = AB + bias, c = gelu(aux)), 4 (BGRADB: c = beta c + op(A)op(B), bias[M] = row sums
 * of op(A)) and 5 (DGELU_BGRAD: c = op(A)op(B) * gelu'(aux), bias[N] = c's column sums). Takes tensors
 * (the device run passes their storages to the cuda addon) and writes into c, bias and aux.
 */
export function cpuGemmEpilogue(nt, C) {
  const into = (dst, src) => nt.scope(() => {
    const s = src.to({ dtype: dst.dtype, device: 'cpu' });
    C.copy(dst.storage, 0, s.storage, 0, s.nbytes);
  });
  return ({ a, b, c, transA = false, transB = false, beta = 0, bias = null, epilogue, aux = null }) => nt.scope(() => {
    const A = a.to('f32'), B = b.to('f32');
    const ab = nt.matmul(A, B, { transA, transB });
    if (epilogue === 3) {
      const pre = bias ? nt.add(ab, bias.to('f32')) : ab;
      into(c, nt.gelu(pre));
      if (aux) into(aux, pre);
    } else if (epilogue === 4) {
      into(c, beta ? nt.add(nt.scale(c.to('f32'), beta), ab) : ab);
      if (bias) into(bias, transA ? nt.sum(A, 0) : nt.sum(A, 1));
    } else if (epilogue === 5) {
      const dPre = nt.zeros(ab.shape), db = nt.zeros([ab.shape[1]]);
      C.bias_gelu_backward(aux.to('f32').storage, ab.storage, dPre.storage, db.storage, ab.shape[0], ab.shape[1], 0);
      into(c, dPre);
      if (bias) into(bias, db);
    } else {
      throw new Error(`cpuGemmEpilogue: epilogue ${epilogue} has no cpu stand-in`);
    }
  });
}
