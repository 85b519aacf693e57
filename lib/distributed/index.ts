// The distributed API: rendezvous stores, the launch environment, and (from other modules) communicators.
export * from './store.js';
export * from './env.js';
export * from './redis-store.js';
