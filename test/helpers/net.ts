// Network helpers shared by the tests that start servers: a loopback port that is free right now.
import { createServer } from 'node:net';

/** A TCP port on 127.0.0.1 that nothing listens on at the moment of the call. */
export async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
  const port = (srv.address() as { port: number }).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}
