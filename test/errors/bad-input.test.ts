// The bad-input corpus of the public API (test/errors/bad-input-cases.ts, and the collectives of a
// world of one below): each case must raise its typed error with a message saying what was wrong,
// and afterwards the process must be healthy: a small op still computes the right numbers, the
// default generator still draws, and no tensor leaked.
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { BAD_INPUTS, type BadInput } from './bad-input-cases.js';

/** A small matmul gives the right numbers, the default generator draws finite values from a finite offset. */
function expectHealthy(): void {
  nt.scope(() => {
    const a = nt.tensor([[1, 2], [3, 4]]), b = nt.tensor([[5, 6], [7, 8]]);
    expect(Array.from(nt.matmul(a, b).toArraySync())).toEqual([19, 22, 43, 50]);
    expect(Number.isSafeInteger(nt.defaultGenerator.offsetBlocks)).toBe(true);
    const r = nt.rand([8]).toArraySync();
    expect(r.every((v) => v >= 0 && v < 1)).toBe(true);
  });
}

async function expectBadInput(c: BadInput): Promise<void> {
  const before = nt.memoryStats().liveTensors;
  let caught: unknown;
  let returned: unknown;
  try {
    returned = await c.run();
  } catch (e) {
    caught = e;
  }
  if (returned instanceof nt.Tensor) returned.dispose();
  expect(caught, `${c.name}: no error (returned ${String(returned)})`).toBeDefined();
  expect(caught, `${c.name}: ${String(caught)}\n${(caught as Error)?.stack}`).toBeInstanceOf(c.error);
  expect(caught).toBeInstanceOf(nt.NodetronError);
  expect((caught as nt.NodetronError).code).toMatch(/^ERR_/);
  expect((caught as Error).message).toMatch(c.message);
  expect(nt.memoryStats().liveTensors, `${c.name}: leaked tensors`).toBe(before);
  expectHealthy();
}

const total = Object.values(BAD_INPUTS).reduce((n, cases) => n + cases.length, 0);

describe('bad input: the public API', () => {
  it(`holds well over 200 cases (${total})`, () => {
    expect(total).toBeGreaterThan(300);
    const names = Object.values(BAD_INPUTS).flat().map((c) => c.name);
    expect(new Set(names).size).toBe(names.length);
  });

  for (const [area, cases] of Object.entries(BAD_INPUTS)) {
    describe(area, () => {
      for (const c of cases) it(c.name, () => expectBadInput(c));
    });
  }

  it('good input around the edges still works', () => {
    nt.scope(() => {
      expect(Array.from(nt.tensor([-(2 ** 31), 2 ** 31 - 1], { dtype: 'i32' }).toArraySync())).toEqual([-(2 ** 31), 2 ** 31 - 1]);
      expect(Array.from(nt.tensor([0, 255], { dtype: 'u8' }).toArraySync())).toEqual([0, 255]);
      expect(Array.from(nt.full([2], 255, { dtype: 'u8' }).toArraySync())).toEqual([255, 255]);
      expect(Array.from(nt.arange(250, 256, 1, { dtype: 'u8' }).toArraySync())).toEqual([250, 251, 252, 253, 254, 255]);
      expect(Array.from(nt.tensor([2.75, -3, NaN, 3e9]).to('i32').toArraySync())).toEqual([2, -3, 0, 2 ** 31 - 1]);
      expect(nt.tensor([1e6], { dtype: 'f16' }).toArraySync()[0]).toBe(Infinity);
      expect(nt.arange(3, { dtype: 'f32', requiresGrad: true }).requiresGrad).toBe(true);
      const t = nt.zeros([2], { dtype: 'i32' });
      t.requiresGrad = false;
      expect(t.requiresGrad).toBe(false);
      expect(nt.randomShard('normal', [2], 2, 4, { seed: 1 }).size).toBe(2);
      expect(nt.optim.clipFactor(NaN, 1)).toBeNaN();
    });
    expectHealthy();
  });
});

describe('bad input: init() and sample()', () => {
  it('a malformed env is a typed error before anything connects; sample checks its arguments', async () => {
    const good = nt.distributed.readLaunchEnv({});
    const bad: Array<[unknown, RegExp]> = [
      [null, /env must be a LaunchEnv object/], ['x', /env must be a LaunchEnv object/], [[], /got an array/],
      [{}, /env.worldSize must be an integer >= 1/], [{ ...good, rank: -1 }, /env.rank must be an integer >= 0/],
      [{ ...good, rank: 1 }, /env.rank 1 must be below env.worldSize 1/], [{ ...good, worldSize: 1.5 }, /env.worldSize must be an integer/],
      [{ ...good, masterPort: 70000 }, /masterPort must be at most 65535/], [{ ...good, masterAddr: 7 }, /env.masterAddr must be a host name/],
      [{ ...good, localRank: 2 }, /env.localRank 2 must be below env.localWorldSize 1/], [{ ...good, storePrefix: undefined }, /env.storePrefix must be a string/],
    ];
    for (const [env, message] of bad) {
      const e = await nt.distributed.init({ env: env as never }).then(() => null, (x: unknown) => x);
      expect(e, String(message)).toBeInstanceOf(nt.ArgumentError);
      expect((e as Error).message).toMatch(message);
    }
    const logits = Float32Array.from([0, 1, 2]);
    for (const [args, message] of [
      [[logits, NaN, undefined, 0.5], /temperature must be a finite number > 0/], [[logits, 0, undefined, 0.5], /temperature/],
      [[logits, Infinity, undefined, 0.5], /temperature/], [[logits, 1, 0, 0.5], /topK must be an integer >= 1/],
      [[logits, 1, 1.5, 0.5], /topK/], [[logits, 1, undefined, 1], /u must be a uniform number in \[0, 1\)/],
      [[logits, 1, undefined, NaN], /u must be/], [[new Float32Array(0), 1, undefined, 0.5], /non-empty Float32Array/],
      [[[0, 1], 1, undefined, 0.5], /non-empty Float32Array/],
    ] as Array<[unknown[], RegExp]>) {
      expect(() => (nt.nn.sample as (...a: unknown[]) => number)(...args)).toThrow(nt.ArgumentError);
      expect(() => (nt.nn.sample as (...a: unknown[]) => number)(...args)).toThrow(message);
    }
    // The process is healthy: a world of one still starts after the refusals.
    const { world } = await nt.distributed.init({ timeoutMs: 5000, env: good });
    expect(world.size).toBe(1);
    await nt.distributed.destroy();
  });
});

describe('bad input: collectives of a world of one', () => {
  afterAll(async () => { await nt.distributed.destroy(); });

  it('rejects bad arguments with typed errors and keeps working', async () => {
    const { world } = await nt.distributed.init({ timeoutMs: 5000, env: nt.distributed.readLaunchEnv({}) });
    const x = nt.keep(nt.ones([4]));
    const A = nt.ArgumentError, S = nt.ShapeError, D = nt.DTypeError;
    const cases: BadInput[] = [
      { name: 'allReduce: op Object.prototype key', run: () => world.allReduce(x, { op: 'constructor' as never }), error: A, message: /op must be one of sum, avg, max, min, prod, got constructor/ },
      { name: 'allReduce: op toString', run: () => world.allReduce(x, { op: 'toString' as never }), error: A, message: /op must be one of/ },
      { name: 'allReduce: op mean', run: () => world.allReduce(x, { op: 'mean' as never }), error: A, message: /op must be one of/ },
      { name: 'allReduce: op number', run: () => world.allReduce(x, { op: 0 as never }), error: A, message: /op must be one of/ },
      { name: 'allReduce: not a tensor', run: () => world.allReduce([1, 2] as never), error: A, message: /must be a Tensor/ },
      { name: 'allReduce: timeoutMs 0', run: () => world.allReduce(x, { timeoutMs: 0 }), error: A, message: /timeoutMs must be a number >= 1/ },
      { name: 'allReduce: timeoutMs NaN', run: () => world.allReduce(x, { timeoutMs: NaN }), error: A, message: /timeoutMs/ },
      { name: 'allReduce: out of another size', run: () => nt.scope(() => world.allReduce(x, { out: nt.zeros([3]) })), error: S, message: /must hold 4 elements/ },
      { name: 'allReduce: out of another dtype', run: () => nt.scope(() => world.allReduce(x, { out: nt.zeros([4], { dtype: 'bf16' }) })), error: D, message: /bf16/ },
      { name: 'broadcast: root outside the group', run: () => world.broadcast(x, { root: 1 }), error: A, message: /outside the group/ },
      { name: 'broadcast: negative root', run: () => world.broadcast(x, { root: -1 }), error: A, message: /outside the group/ },
      { name: 'broadcast: fractional root', run: () => world.broadcast(x, { root: 0.5 }), error: A, message: /outside the group/ },
      { name: 'send: to self', run: () => world.send(x, 0), error: A, message: /cannot send to itself/ },
      { name: 'send: to a rank outside', run: () => world.send(x, 3), error: A, message: /dst 3 is outside the group/ },
      { name: 'allGather: out of the wrong size', run: () => nt.scope(() => world.allGather(nt.zeros([3]), x)), error: S, message: /out must hold 4 elements, got 3/ },
      { name: 'reduceScatter: op prototype key', run: () => nt.scope(() => world.reduceScatter(nt.zeros([4]), x, { op: 'valueOf' as never })), error: A, message: /op must be one of/ },
      { name: 'newGroup: rank outside the world', run: () => nt.distributed.newGroup([5]), error: A, message: /rank 5 is outside the world/ },
      { name: 'newGroup: not an array', run: () => nt.distributed.newGroup('0' as never), error: A, message: /ranks must be a non-empty array/ },
      { name: 'init twice', run: () => nt.distributed.init(), error: nt.StateError, message: /already initialized/ },
    ];
    for (const c of cases) await expectBadInput(c);
    await world.allReduce(x, { op: 'sum' });
    expect(Array.from(x.toArraySync())).toEqual([1, 1, 1, 1]);
    x.dispose();
  });
});
