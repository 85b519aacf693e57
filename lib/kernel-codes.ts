// Op codes of the native elementwise kernels, mirroring native/core/op_codes.h (both backends compile
// that header; test/core/op-codes.test.ts checks the two agree), shared by the ops and the autograd
// engine (which accumulates gradients with the binary add kernel). Binary max and min are fmax/fmin
// (a NaN operand yields the other one), binary pow is a tensor exponent (unary pow a scalar one).
export const BINARY = { add: 0, sub: 1, mul: 2, div: 3, max: 4, min: 5, pow: 6 } as const;
export const UNARY = { neg: 0, exp: 1, log: 2, sqrt: 3, tanh: 4, pow: 5, scale: 6, addScalar: 7, rsub: 8, rdiv: 9 } as const;
export type UnaryName = keyof typeof UNARY;
