// Op codes of the native elementwise kernels (native/cpu/kernels/elementwise.cc; cuda mirrors them), shared
// by the ops and the autograd engine (which accumulates gradients with the binary add kernel).
export const BINARY = { add: 0, sub: 1, mul: 2, div: 3 } as const;
export const UNARY = { neg: 0, exp: 1, log: 2, sqrt: 3, tanh: 4, pow: 5, scale: 6, addScalar: 7, rsub: 8, rdiv: 9 } as const;
export type UnaryName = keyof typeof UNARY;
