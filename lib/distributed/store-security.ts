// Where the job's rendezvous store listens and which job token its clients present: one policy for
// both processes that serve the store, node 0's launcher (lib/launch/cli.ts) and rank 0's init()
// under srun/mpirun or in a world of one (lib/distributed/init.ts).
import { randomBytes } from 'node:crypto';
import { ArgumentError } from '../errors.js';
import { isLoopbackHost } from './store-api.js';

/** What a store's server needs to know to decide its listen address and job token. */
export interface StoreServing {
  /** The address every client dials (MASTER_ADDR / --master-addr). */
  masterAddr: string;
  /** The port clients dial, for messages (undefined: a free one is chosen). */
  masterPort: number | undefined;
  /** The job token given (NODETRON_STORE_TOKEN, already checked), or undefined. */
  token: string | undefined;
  /** Whether this server hands the token to every client itself (a one-node launch, a world of one), so it may make one. */
  makeToken: boolean;
  /** Who serves the store, as messages name it ("node 0's launcher", "init: rank 0"). */
  server: string;
  /** What starts the job's processes, where the token must be exported ("nodetron launch", "srun/mpirun"). */
  startedBy: string;
}

/** The store's listen address and job token, as {@link storeSecurity} decides them. */
export interface StoreSecurity {
  /** The token every client presents, or undefined (a store reached over loopback only, with no token given). */
  token: string | undefined;
  /** The interface the store listens on: the loopback address clients dial, or every interface (0.0.0.0). */
  listenHost: string;
  /** A line for the log when the store runs without a token. */
  warning?: string;
}

/**
 * The store's listen address and job token. Clients dial `masterAddr`, so the store listens there when
 * it is a loopback address (127.0.0.1 for `localhost`), else on every interface. The token is the one
 * given; else a random one when the server hands it to every client itself (`makeToken`); else none on
 * loopback (with a warning). Beyond loopback without a token it throws ArgumentError saying how to set one.
 */
export function storeSecurity(o: StoreServing): StoreSecurity {
  const loopback = isLoopbackHost(o.masterAddr);
  const listenHost = !loopback ? '0.0.0.0' : o.masterAddr === 'localhost' ? '127.0.0.1' : o.masterAddr;
  if (o.token !== undefined) return { token: o.token, listenHost };
  if (o.makeToken) return { token: randomBytes(32).toString('hex'), listenHost };
  const where = o.masterPort === undefined ? o.masterAddr : `${o.masterAddr}:${o.masterPort}`;
  const make = `export NODETRON_STORE_TOKEN=$(openssl rand -hex 32) before ${o.startedBy}, the same value for every process of the job (e.g. in the batch file)`;
  if (loopback) {
    return { token: undefined, listenHost, warning: `the rendezvous store on ${where} has no job token: any process on this machine can use it; to require one, ${make}` };
  }
  throw new ArgumentError(
    `${o.server} would serve the rendezvous store on every interface (clients dial ${where}) without a job token, ` +
      `so anyone who can reach it could read, overwrite or stop the job; ${make}`,
  );
}
