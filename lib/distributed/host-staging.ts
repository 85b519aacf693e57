// Collectives on device tensors through a host communicator (PyTorch's Gloo path for cuda tensors):
// each op copies its device input into host storage, runs the host (Gloo) op, and copies the output
// back onto the device once the op has finished. init() gives a group this for cuda tensors when
// NCCL is not used (several ranks sharing one GPU, or backend 'gloo' on a GPU machine). Slower than
// NCCL by two copies over PCIe per op, but every collective, in place or not, keeps its semantics.
import { dtypeSize, DTYPES } from '../dtype.js';
import { cpu, type NativeStorage } from '../native.js';
import type { CommBackend, CommPromise } from './backend.js';

/** What the staging needs from the device's addon: byte copies between its storages and host arrays. */
export interface DeviceCopies {
  read(s: NativeStorage, offsetBytes: number, out: ArrayBufferView): void;
  write(s: NativeStorage, offsetBytes: number, src: ArrayBufferView): void;
}

const elementBytes = (dtype: number) => dtypeSize(DTYPES[dtype]!);
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

/** A CommBackend for one device's tensors that moves their bytes through `host`. */
export class HostStagedBackend implements CommBackend {
  /** Ops staged so far in this process (for tests and diagnostics). */
  static stagedOps = 0;
  /** `ownsHost`: destroy() destroys the host communicator too (else the group's cpu side owns it). */
  constructor(private readonly host: CommBackend, private readonly device: DeviceCopies, private readonly ownsHost = false) {}

  get rank(): number { return this.host.rank; }
  get size(): number { return this.host.size; }
  get pending(): number { return this.host.pending; }
  get sharedMemory(): boolean | undefined { return this.host.sharedMemory; }
  connect(): Promise<void> { return Promise.resolve(); }
  destroy(): Promise<void> { return this.ownsHost ? this.host.destroy() : Promise.resolve(); }
  /** Aborts the host communicator (whoever owns it): the staged ops in flight reject with its CommError. */
  abort(reason: string): void { this.host.abort?.(reason); }

  // A host storage holding the first `bytes` of `s` (or empty, when the op only writes it).
  #stage(s: NativeStorage, bytes: number, copy: boolean): NativeStorage {
    const h = new (cpu().Storage)(Math.max(bytes, 1), false);
    if (copy && bytes > 0) {
      const buf = new Uint8Array(bytes);
      this.device.read(s, 0, buf);
      cpu().write(h, 0, buf);
    }
    return h;
  }

  /**
   * Runs `op` on host copies: `send` (sendBytes, copied in) and `recv` (recvBytes; the same storage
   * when in place), then copies the host recv back into the device recv once, when the op has
   * finished (through the promise or waitSync, whichever comes first).
   */
  #run(send: NativeStorage | null, sendBytes: number, recv: NativeStorage | null, recvBytes: number,
    op: (hs: NativeStorage | null, hr: NativeStorage | null) => CommPromise): CommPromise {
    HostStagedBackend.stagedOps++;
    const inPlace = send !== null && send === recv;
    const hs = send ? this.#stage(send, inPlace ? Math.max(sendBytes, recvBytes) : sendBytes, true) : null;
    let hr: NativeStorage | null;
    try {
      hr = recv ? (inPlace ? hs : this.#stage(recv, recvBytes, false)) : null;
    } catch (e) {
      hs?.dispose();
      throw e;
    }
    const release = () => {
      hs?.dispose();
      if (hr !== hs) hr?.dispose();
    };
    let settled = false;
    const finish = (ok: boolean) => {
      if (settled) return;
      settled = true;
      try {
        if (ok && recv && hr && recvBytes > 0) {
          const buf = new Uint8Array(recvBytes);
          cpu().read(hr, 0, buf);
          this.device.write(recv, 0, buf);
        }
      } finally {
        // After a failure (a timeout) the host op may still touch them: left to the garbage collector.
        if (ok) release();
      }
    };
    let inner: CommPromise;
    try {
      inner = op(hs, hr);
    } catch (e) {
      // The host op never started: nothing touches the host copies.
      settled = true;
      release();
      throw e;
    }
    const promise = inner.then(() => finish(true), (e: unknown) => { finish(false); throw e; });
    const waitSync = () => {
      try {
        inner.waitSync();
      } catch (e) {
        finish(false);
        throw e;
      }
      finish(true);
    };
    return Object.assign(promise, { waitSync });
  }

  allReduce(send: NativeStorage, recv: NativeStorage, dtype: number, count: number, op: number, seq: number, timeoutMs: number): CommPromise {
    const bytes = count * elementBytes(dtype);
    return this.#run(send, bytes, recv, bytes, (hs, hr) => this.host.allReduce(hs!, hr!, dtype, count, op, seq, timeoutMs));
  }

  broadcast(send: NativeStorage, recv: NativeStorage, dtype: number, count: number, root: number, seq: number, timeoutMs: number): CommPromise {
    const bytes = count * elementBytes(dtype);
    return this.#run(send, bytes, recv, bytes, (hs, hr) => this.host.broadcast(hs!, hr!, dtype, count, root, seq, timeoutMs));
  }

  reduce(send: NativeStorage, recv: NativeStorage, dtype: number, count: number, op: number, root: number, seq: number, timeoutMs: number): CommPromise {
    const bytes = count * elementBytes(dtype);
    return this.#run(send, bytes, recv, bytes, (hs, hr) => this.host.reduce(hs!, hr!, dtype, count, op, root, seq, timeoutMs));
  }

  allGather(send: NativeStorage, recv: NativeStorage, dtype: number, counts: number[], seq: number, timeoutMs: number): CommPromise {
    const e = elementBytes(dtype);
    return this.#run(send, counts[this.rank]! * e, recv, sum(counts) * e, (hs, hr) => this.host.allGather(hs!, hr!, dtype, counts, seq, timeoutMs));
  }

  reduceScatter(send: NativeStorage, recv: NativeStorage, dtype: number, counts: number[], op: number, seq: number, timeoutMs: number): CommPromise {
    const e = elementBytes(dtype);
    // In place the whole send buffer comes back (block rank reduced, the rest unchanged).
    const recvBytes = send === recv ? sum(counts) * e : counts[this.rank]! * e;
    return this.#run(send, sum(counts) * e, recv, recvBytes, (hs, hr) => this.host.reduceScatter(hs!, hr!, dtype, counts, op, seq, timeoutMs));
  }

  allToAll(send: NativeStorage, recv: NativeStorage, dtype: number, sendCounts: number[], recvCounts: number[], seq: number, timeoutMs: number): CommPromise {
    const e = elementBytes(dtype);
    return this.#run(send, sum(sendCounts) * e, recv, sum(recvCounts) * e,
      (hs, hr) => this.host.allToAll(hs!, hr!, dtype, sendCounts, recvCounts, seq, timeoutMs));
  }

  barrier(seq: number, timeoutMs: number): CommPromise { return this.host.barrier(seq, timeoutMs); }

  send(buf: NativeStorage, dtype: number, count: number, dst: number, tag: number, timeoutMs: number): CommPromise {
    return this.#run(buf, count * elementBytes(dtype), null, 0, (hs) => this.host.send(hs!, dtype, count, dst, tag, timeoutMs));
  }

  recv(buf: NativeStorage, dtype: number, count: number, src: number, tag: number, timeoutMs: number): CommPromise {
    return this.#run(null, 0, buf, count * elementBytes(dtype), (_hs, hr) => this.host.recv(hr!, dtype, count, src, tag, timeoutMs));
  }
}
