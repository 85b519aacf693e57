// The test-only addon (native/testing, built as build/Release/nodetron_testing.node unless the CMake
// option NT_TESTING is OFF; never shipped in the package): the cuda caching allocator's bookkeeping
// over simulated memory (HostAllocatorSim), so its tests need no GPU.
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { BackendUnavailableError, errorFromCode } from '../errors.js';
import { packageRoot } from '../native.js';

const require = createRequire(import.meta.url);
let addon: Record<string, any> | undefined;

/** The test-only addon; BackendUnavailableError when this installation has none. */
export function testingAddon(): Record<string, any> {
  if (addon) return addon;
  const path = ['Release', 'Debug'].map((c) => join(packageRoot, 'build', c, 'nodetron_testing.node')).find((p) => existsSync(p));
  if (!path) {
    throw new BackendUnavailableError('the test-only addon nodetron_testing.node is not built: build from a checkout with the CMake option NT_TESTING on (the default)', 'loadTesting');
  }
  const loaded = require(path) as Record<string, any>;
  loaded.setErrorFactory((code: string, message: string, call: string) => errorFromCode(code, message, call));
  addon = loaded;
  return loaded;
}
