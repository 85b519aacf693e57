// Checks of the emulated cuda kernels against scalar references (see run.sh).
#include "kernels_emu.h"
#include <random>
#include <type_traits>
#include <cstdio>
using namespace nt;
using namespace nt::cuda;
static int failures = 0, checks = 0;
#define EXPECT(c, ...) do { checks++; if (!(c)) { failures++; std::printf("FAIL %s:%d: ", __FILE__, __LINE__); std::printf(__VA_ARGS__); std::printf("\n"); } } while (0)
static std::mt19937 rng(42);
static std::vector<float> randv(size_t n) { std::normal_distribution<float> d; std::vector<float> v(n); for (auto& x : v) x = d(rng); return v; }
template <class T> static std::vector<T> conv(const std::vector<float>& v) { std::vector<T> o(v.size()); for (size_t i = 0; i < v.size(); i++) o[i] = fromF32<T>(v[i]); return o; }
template <class T> static bool same(T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }
// A buffer whose data starts `shift` elements past a 256-byte boundary.
template <class T> struct Buf { std::vector<unsigned char> raw; T* p; Buf(size_t n, size_t shift = 0) : raw((n + shift) * sizeof(T) + 512) { uintptr_t a = (reinterpret_cast<uintptr_t>(raw.data()) + 255) / 256 * 256; p = reinterpret_cast<T*>(a) + shift; } };

template <class T> void testMap(size_t n, size_t shift) {
  auto va = conv<T>(randv(n)), vb = conv<T>(randv(n));
  Buf<T> a(n, shift), b(n, shift), o(n, shift);
  std::memcpy(a.p, va.data(), n * sizeof(T)); std::memcpy(b.p, vb.data(), n * sizeof(T));
  launchMap3<T>(nullptr, BinaryF{binary_op::kMul}, a.p, b.p, nullptr, o.p, int64_t(n));
  for (size_t i = 0; i < n; i++) EXPECT(same(o.p[i], fromF32<T>(toF32(va[i]) * toF32(vb[i]))), "map mul n=%zu shift=%zu i=%zu", n, shift, i);
  // in place unary (out aliases input), and unary_backward with a null input
  launchMap3<T>(nullptr, UnaryF{unary_op::kExp, 0.f}, a.p, nullptr, nullptr, a.p, int64_t(n));
  for (size_t i = 0; i < n; i++) EXPECT(same(a.p[i], fromF32<T>(expf(toF32(va[i])))), "map exp in place n=%zu i=%zu", n, i);
  launchMap3<T>(nullptr, UnaryGradF{unary_op::kTanh, 0.f}, (const T*)nullptr, b.p, a.p, o.p, int64_t(n));
  for (size_t i = 0; i < n; i++) { float y = toF32(vb[i]); EXPECT(same(o.p[i], fromF32<T>(toF32(a.p[i]) * (1.f - y * y))), "map tanh grad i=%zu", i); }
  launchMap3<T>(nullptr, GeluGradF{}, b.p, a.p, nullptr, o.p, int64_t(n));
  for (size_t i = 0; i < n; i++) EXPECT(same(o.p[i], fromF32<T>(toF32(b.p[i]) * geluTanhGrad(toF32(a.p[i])))), "map gelu grad i=%zu", i);
  launchMap3<T>(nullptr, ScaleF{0.3f}, o.p, nullptr, nullptr, b.p, int64_t(n));
  for (size_t i = 0; i < n; i++) EXPECT(same(b.p[i], fromF32<T>(toF32(o.p[i]) * 0.3f)), "map scale i=%zu", i);
}

template <class T> void testRowSums(int64_t rows, int64_t cols) {
  auto v = conv<T>(randv(size_t(rows * cols)));
  std::vector<T> out(static_cast<size_t>(rows));
  std::vector<double> sq(static_cast<size_t>(rows));
  launchRowSums<T, false, T>(0, nullptr, v.data(), rows, cols, out.data(), "t");
  launchRowSums<T, true, double>(0, nullptr, v.data(), rows, cols, sq.data(), "t");
  for (int64_t r = 0; r < rows; r++) {
    double s = 0, s2 = 0, sa = 0;
    for (int64_t j = 0; j < cols; j++) { double x = toF32(v[size_t(r * cols + j)]); s += x; s2 += x * x; sa += std::fabs(x); }
    float want = float(s);
    EXPECT(std::fabs(toF32(out[size_t(r)]) - toF32(fromF32<T>(want))) <= 1e-6 * sa + (sizeof(T) == 2 ? 1e-2 * std::fabs(want) : 0), "rowsum %ldx%ld r=%ld got %g want %g", long(rows), long(cols), long(r), toF32(out[size_t(r)]), want);
    EXPECT(std::fabs(sq[size_t(r)] - s2) <= 1e-12 * s2, "rowsq %ldx%ld r=%ld got %.17g want %.17g", long(rows), long(cols), long(r), sq[size_t(r)], s2);
  }
}

// lib's sumTo: output strides of `target` (trailing-aligned) over `shape`.
void testSumTo(std::vector<int64_t> shape, std::vector<int64_t> target) {
  size_t lead = shape.size() - target.size();
  std::vector<int64_t> own(target.size());
  int64_t acc = 1;
  for (size_t i = target.size(); i-- > 0;) { own[i] = acc; acc *= target[i]; }
  std::vector<int64_t> so(shape.size());
  for (size_t i = 0; i < shape.size(); i++) { long d = long(i) - long(lead); so[i] = d < 0 || (target[size_t(d)] == 1 && shape[i] != 1) ? 0 : own[size_t(d)]; }
  int64_t n = product(shape), nOut = acc;
  auto x = randv(size_t(n));
  std::vector<float> out(size_t(nOut), 12345.f);
  std::vector<double> ref(size_t(nOut), 0.0), mag(size_t(nOut), 0.0);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; i++) {
    int64_t o = 0, rem = i;
    for (size_t d = shape.size(); d-- > 0;) { o += (rem % shape[d]) * so[d]; rem /= shape[d]; }
    ref[size_t(o)] += x[size_t(i)];
    mag[size_t(o)] += std::fabs(x[size_t(i)]);
  }
  long before = g_launches;
  launchSumTo<float>(0, nullptr, x.data(), out.data(), shape, so, nOut, "sum_to");
  std::string sh; for (auto s : shape) sh += std::to_string(s) + ",";
  for (int64_t i = 0; i < nOut; i++)
    EXPECT(std::fabs(out[size_t(i)] - float(ref[size_t(i)])) <= 1e-6 * mag[size_t(i)] + 1e-30, "sum_to [%s] out %ld got %g want %g", sh.c_str(), long(i), out[size_t(i)], ref[size_t(i)]);
  std::printf("sum_to [%s] -> %ld outputs, %ld launches\n", sh.c_str(), long(nOut), g_launches - before);
}

// The cpu backend's blockColumnSums order for the norm gradients: exact match expected.
template <bool kRms> void testNormGrads(int64_t rows, int64_t cols, bool exact) {
  auto dy = randv(size_t(rows * cols)), x = randv(size_t(rows * cols)), mean = randv(size_t(rows)), rstd = randv(size_t(rows));
  std::vector<float> dw(static_cast<size_t>(cols)), db(static_cast<size_t>(cols));
  launchColumnSums<2>(0, nullptr, NormParamRows<float, kRms>{dy.data(), x.data(), mean.data(), rstd.data(), cols}, rows, cols, dw.data(),
                      kRms ? (float*)nullptr : db.data(), "t");
  int64_t blocks = (rows + 63) / 64;
  std::vector<double> pw(size_t(blocks * cols), 0), pb(size_t(blocks * cols), 0);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++) {
      float g = dy[size_t(r * cols + j)], m = kRms ? 0.f : mean[size_t(r)];
      float xh = (x[size_t(r * cols + j)] - m) * rstd[size_t(r)];
      pw[size_t((r / 64) * cols + j)] += double(g * xh);
      pb[size_t((r / 64) * cols + j)] += double(g);
    }
  for (int64_t j = 0; j < cols; j++) {
    double sw = 0, sb = 0;
    for (int64_t b = 0; b < blocks; b++) { sw += pw[size_t(b * cols + j)]; sb += pb[size_t(b * cols + j)]; }
    if (exact) EXPECT(dw[size_t(j)] == float(sw), "norm dW %ldx%ld j=%ld got %.9g want %.9g", long(rows), long(cols), long(j), dw[size_t(j)], float(sw));
    else EXPECT(std::fabs(dw[size_t(j)] - float(sw)) <= 1e-5 * (1 + std::fabs(sw)), "norm dW %ldx%ld j=%ld", long(rows), long(cols), long(j));
    if (!kRms) {
      if (exact) EXPECT(db[size_t(j)] == float(sb), "norm dB %ldx%ld j=%ld got %.9g want %.9g", long(rows), long(cols), long(j), db[size_t(j)], float(sb));
      else EXPECT(std::fabs(db[size_t(j)] - float(sb)) <= 1e-5 * (1 + std::fabs(sb)), "norm dB j=%ld", long(j));
    }
  }
}

template <class T> void testBiasGelu(int64_t rows, int64_t cols, size_t shift) {
  int64_t n = rows * cols;
  auto pre = conv<T>(randv(size_t(n))), bias = conv<T>(randv(size_t(cols)));
  Buf<T> p(size_t(n), shift), b(size_t(cols), shift), y(size_t(n), shift);
  std::memcpy(p.p, pre.data(), size_t(n) * sizeof(T)); std::memcpy(b.p, bias.data(), size_t(cols) * sizeof(T));
  launchBiasGeluForward<T>(nullptr, p.p, b.p, y.p, rows, cols);
  for (int64_t i = 0; i < n; i++) {
    T st = fromF32<T>(toF32(pre[size_t(i)]) + toF32(bias[size_t(i % cols)]));
    EXPECT(same(p.p[i], st), "biasgelu pre i=%ld", long(i));
    EXPECT(same(y.p[i], fromF32<T>(geluTanh(toF32(st)))), "biasgelu y i=%ld", long(i));
  }
  // bias gradient column sums of the stored values
  std::vector<T> db(static_cast<size_t>(cols));
  launchColumnSums<1>(0, nullptr, ColumnRead<T>{y.p, cols}, rows, cols, db.data(), (T*)nullptr, "t");
  for (int64_t j = 0; j < cols; j++) {
    int64_t blocks = (rows + 63) / 64; double s = 0;
    for (int64_t bl = 0; bl < blocks; bl++) { double a = 0; for (int64_t r = bl * 64; r < std::min(rows, bl * 64 + 64); r++) a += double(toF32(y.p[r * cols + j])); s += a; }
    EXPECT(same(db[size_t(j)], fromF32<T>(float(s))), "bias grad j=%ld", long(j));
  }
}

// gemm.cu's epilogue fallbacks (cuBLASLt without an algorithm for an epilogue): GELU of the GEMM's
// output in place (pre and y the same buffer), GELU's gradient in place over the GEMM's output then
// its column sums (DGELU_BGRAD), and the bias gradient of op(A) = Aᵀ as column sums of the stored
// A [K, M] (BGRADB), each against the out-of-place kernels and a double reference.
template <class T> void testEpilogueFallbacks(int64_t rows, int64_t cols, size_t shift) {
  int64_t n = rows * cols;
  auto vc = conv<T>(randv(size_t(n))), vp = conv<T>(randv(size_t(n))), vb = conv<T>(randv(size_t(cols)));
  Buf<T> c(size_t(n), shift), pre(size_t(n), shift), b(size_t(cols), shift), y(size_t(n), shift), p2(size_t(n), shift);
  std::memcpy(c.p, vc.data(), size_t(n) * sizeof(T)); std::memcpy(p2.p, vc.data(), size_t(n) * sizeof(T));
  std::memcpy(pre.p, vp.data(), size_t(n) * sizeof(T)); std::memcpy(b.p, vb.data(), size_t(cols) * sizeof(T));
  // gelu(C + bias) into C itself, against the out-of-place kernel (pre p2, y).
  launchBiasGeluForward<T>(nullptr, c.p, b.p, c.p, rows, cols);
  launchBiasGeluForward<T>(nullptr, p2.p, b.p, y.p, rows, cols);
  for (int64_t i = 0; i < n; i++) EXPECT(same(c.p[i], y.p[i]), "gelu epilogue in place %ldx%ld i=%ld", long(rows), long(cols), long(i));
  // dgelu in place over the "GEMM output", then the bias gradient.
  std::memcpy(c.p, vc.data(), size_t(n) * sizeof(T));
  launchMap3<T>(nullptr, GeluGradF{}, c.p, pre.p, nullptr, c.p, n);
  std::vector<T> db(static_cast<size_t>(cols));
  launchColumnSums<1>(0, nullptr, ColumnRead<T>{c.p, cols}, rows, cols, db.data(), (T*)nullptr, "t");
  for (int64_t i = 0; i < n; i++)
    EXPECT(same(c.p[i], fromF32<T>(toF32(vc[size_t(i)]) * geluTanhGrad(toF32(vp[size_t(i)])))), "dgelu in place %ldx%ld i=%ld", long(rows), long(cols), long(i));
  for (int64_t j = 0; j < cols; j++) {
    double s = 0, mag = 0;
    for (int64_t r = 0; r < rows; r++) { double v = toF32(c.p[r * cols + j]); s += v; mag += std::fabs(v); }
    EXPECT(std::fabs(toF32(db[size_t(j)]) - s) <= 1e-6 * mag + (sizeof(T) == 2 ? 8e-3 * std::fabs(s) : 1e-7 * std::fabs(s)), "dgelu bgrad j=%ld got %g want %g", long(j), toF32(db[size_t(j)]), s);
  }
  // bgrad: A stored [K = rows, M = cols]; bias[i] = sum_k A[k][i], in f32 (the f16/bf16->f32 output) and in T.
  std::vector<float> b32(static_cast<size_t>(cols));
  std::vector<T> bT(static_cast<size_t>(cols));
  launchColumnSums<1>(0, nullptr, StoredColumns<T>{pre.p, cols}, rows, cols, b32.data(), (float*)nullptr, "t");
  launchColumnSums<1>(0, nullptr, StoredColumns<T>{pre.p, cols}, rows, cols, bT.data(), (T*)nullptr, "t");
  for (int64_t j = 0; j < cols; j++) {
    double s = 0, mag = 0;
    for (int64_t r = 0; r < rows; r++) { double v = toF32(pre.p[r * cols + j]); s += v; mag += std::fabs(v); }
    EXPECT(std::fabs(b32[size_t(j)] - s) <= 1e-6 * mag, "bgrad f32 %ldx%ld j=%ld got %g want %g", long(rows), long(cols), long(j), b32[size_t(j)], s);
    EXPECT(same(bT[size_t(j)], fromF32<T>(b32[size_t(j)])), "bgrad %ldx%ld j=%ld in T", long(rows), long(cols), long(j));
  }
}

// The host reference of binary op `op` (op_codes.h), as the kernels compute it in f32.
static float binaryRef(int op, float x, float y) {
  using namespace binary_op;
  switch (op) {
    case kAdd: return x + y;
    case kSub: return x - y;
    case kMul: return x * y;
    case kDiv: return x / y;
    case kMax: return std::fmax(x, y);
    case kMin: return std::fmin(x, y);
    default: return std::pow(x, y);
  }
}

// Every binary op over one broadcast (b's values kept positive for pow, so no NaN to compare).
template <class T> void testBinary(std::vector<int64_t> shape, std::vector<int64_t> sa, std::vector<int64_t> sb, int64_t na, int64_t nb) {
  auto a = conv<T>(randv(size_t(na))), b = conv<T>(randv(size_t(nb)));
  auto bPos = b;
  for (auto& v : bPos) v = fromF32<T>(std::fabs(toF32(v)) + 0.5f);
  auto aPos = a;
  for (auto& v : aPos) v = fromF32<T>(std::fabs(toF32(v)) + 0.25f);
  int64_t n = product(shape);
  std::vector<T> out(static_cast<size_t>(n));
  Strides s = Strides::of(shape, sa, sb, "binary");
  long before = g_launches;
  for (int op = 0; op < binary_op::kBinaryOpCount; op++) {
    const std::vector<T>& x = op == binary_op::kPow ? aPos : a;
    const std::vector<T>& y = op == binary_op::kPow ? bPos : b;
    launchBinary<T>(nullptr, op, x.data(), y.data(), out.data(), shape, sa, sb, s);
    for (int64_t i = 0; i < n; i++) {
      int64_t ia = 0, ib = 0, rem = i;
      for (size_t d = shape.size(); d-- > 0;) { int64_t c = rem % shape[d]; rem /= shape[d]; ia += c * sa[d]; ib += c * sb[d]; }
      EXPECT(same(out[size_t(i)], fromF32<T>(binaryRef(op, toF32(x[size_t(ia)]), toF32(y[size_t(ib)])))), "binary op %d i=%ld", op, long(i));
    }
  }
  std::printf("binary %zu dims: %ld launches for %d ops\n", shape.size(), g_launches - before, int(binary_op::kBinaryOpCount));
}

template <class S, class D> void testCast(int64_t n, size_t shift) {
  auto v = randv(size_t(n));
  for (auto& x : v) x *= 100;
  Buf<S> src(size_t(n), shift);
  Buf<D> dst(size_t(n), shift);
  for (int64_t i = 0; i < n; i++) src.p[i] = fromF32<S>(v[size_t(i)]);
  constexpr int N = castWidth<S, D>();
  bool vec = alignedTo(src.p, sizeof(S) * N) && alignedTo(dst.p, sizeof(D) * N);
  emuLaunch(castKernel<S, D>, gridFor(vec ? (n + N - 1) / N : n), kThreads, 0, nullptr, (const S*)src.p, dst.p, n, vec);
  for (int64_t i = 0; i < n; i++) EXPECT(same(dst.p[i], fromF32<D>(toF32(src.p[i]))), "cast i=%ld vec=%d", long(i), int(vec));
  Buf<D> f(size_t(n), shift);
  D val = fromF32<D>(3.0f);
  launchFill<D>(nullptr, f.p, val, n);
  for (int64_t i = 0; i < n; i++) EXPECT(same(f.p[i], val), "fill i=%ld", long(i));
}

// LAMB's three kernels over two tensors (one of several chunks, one of one element) and AdamW's,
// against the cpu kernel's formulas (norms in double).
template <class P> void testOptim(bool lamb) {
  std::vector<int64_t> sizes{70001, 1, 0, 300};
  std::vector<std::vector<P>> params;
  std::vector<std::vector<float>> grads, ms, vs;
  std::vector<TensorEntry> entries;
  std::vector<Chunk> chunks;
  std::vector<int32_t> first;
  for (size_t k = 0; k < sizes.size(); k++) {
    params.push_back(conv<P>(randv(size_t(sizes[k]))));
    grads.push_back(randv(size_t(sizes[k])));
    ms.push_back(randv(size_t(sizes[k])));
    vs.push_back(randv(size_t(sizes[k])));
    for (auto& v : vs.back()) v = v * v;
  }
  auto p0 = params; auto m0 = ms; auto v0 = vs;
  for (size_t k = 0; k < sizes.size(); k++) {
    entries.push_back({params[k].data(), grads[k].data(), ms[k].data(), vs[k].data(), sizes[k]});
    first.push_back(int32_t(chunks.size()));
    for (int64_t s = 0; s < sizes[k]; s += kChunk) chunks.push_back({int32_t(k), s});
  }
  first.push_back(int32_t(chunks.size()));
  Hyper h{1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.5f, 0.19f, 0.0019990005f};
  std::vector<double> chunkNorms(chunks.size() * 2), norms(sizes.size() * 2);
  unsigned blocks = unsigned(chunks.size());
  if (lamb) {
    emuLaunch(lambNormsKernel<P, float>, blocks, kThreads, 0, nullptr, (const TensorEntry*)entries.data(), (const Chunk*)chunks.data(), h, chunkNorms.data());
    emuLaunch(lambTensorNormsKernel, gridFor(int64_t(sizes.size())), kThreads, 0, nullptr, (const double*)chunkNorms.data(), (const int32_t*)first.data(), norms.data(), int64_t(sizes.size()));
    emuLaunch(lambApplyKernel<P>, blocks, kThreads, 0, nullptr, (const TensorEntry*)entries.data(), (const Chunk*)chunks.data(), h, (const double*)norms.data());
  } else {
    emuLaunch(adamwKernel<P, float>, blocks, kThreads, 0, nullptr, (const TensorEntry*)entries.data(), (const Chunk*)chunks.data(), h);
  }
  for (size_t k = 0; k < sizes.size(); k++) {
    double pw = 0, uu = 0;
    std::vector<float> us(size_t(sizes[k]));
    for (int64_t i = 0; i < sizes[k]; i++) {
      float g = grads[k][size_t(i)] * h.gradScale;
      float m = h.beta1 * m0[k][size_t(i)] + (1.0f - h.beta1) * g, v = h.beta2 * v0[k][size_t(i)] + (1.0f - h.beta2) * g * g;
      EXPECT(ms[k][size_t(i)] == m && vs[k][size_t(i)] == v, "optim moments k=%zu i=%ld", k, long(i));
      float w = toF32(p0[k][size_t(i)]);
      float u = (m / h.bias1) / (sqrtf(v / h.bias2) + h.eps) + h.weightDecay * w;
      us[size_t(i)] = u;
      pw += double(w) * w;
      uu += double(u) * u;
    }
    if (lamb) {
      EXPECT(std::fabs(norms[2 * k] - pw) <= 1e-12 * pw && std::fabs(norms[2 * k + 1] - uu) <= 1e-12 * uu, "lamb norms k=%zu %g %g vs %g %g", k, norms[2 * k], norms[2 * k + 1], pw, uu);
    }
    double ratio = pw > 0 && uu > 0 ? std::sqrt(pw) / std::sqrt(uu) : 1.0;
    for (int64_t i = 0; i < sizes[k]; i++) {
      float w = toF32(p0[k][size_t(i)]);
      float want = lamb ? w - float(double(h.lr) * ratio) * us[size_t(i)] : w - h.lr * ((us[size_t(i)] - h.weightDecay * w) + h.weightDecay * w);
      EXPECT(std::fabs(toF32(params[k][size_t(i)]) - toF32(fromF32<P>(want))) <= 1e-6 * (1 + std::fabs(want)) + (sizeof(P) == 2 ? 1e-2 * std::fabs(want) : 0),
             "optim %s param k=%zu i=%ld got %g want %g", lamb ? "lamb" : "adamw", k, long(i), toF32(params[k][size_t(i)]), want);
    }
  }
}

// swiglu/silu functors (swiglu.cu) through launchMap3 against the same float formulas.
template <class T> void testSwiglu(size_t n, size_t shift) {
  auto vg = conv<T>(randv(n)), vu = conv<T>(randv(n)), vd = conv<T>(randv(n));
  Buf<T> g(n, shift), u(n, shift), d(n, shift), o(n, shift), o2(n, shift);
  std::memcpy(g.p, vg.data(), n * sizeof(T)); std::memcpy(u.p, vu.data(), n * sizeof(T)); std::memcpy(d.p, vd.data(), n * sizeof(T));
  auto sig = [](float x) { return 1.0f / (1.0f + expf(-x)); };
  launchMap3<T>(nullptr, SwigluF{}, g.p, u.p, nullptr, o.p, int64_t(n));
  launchMap3<T>(nullptr, SiluF{}, g.p, nullptr, nullptr, o2.p, int64_t(n));
  for (size_t i = 0; i < n; i++) {
    float x = toF32(vg[i]), up = toF32(vu[i]);
    EXPECT(same(o.p[i], fromF32<T>(x * sig(x) * up)), "swiglu n=%zu shift=%zu i=%zu", n, shift, i);
    EXPECT(same(o2.p[i], fromF32<T>(x * sig(x))), "silu n=%zu i=%zu", n, i);
  }
  launchMap3<T>(nullptr, SwigluGateGradF{}, d.p, g.p, u.p, o.p, int64_t(n));
  launchMap3<T>(nullptr, SwigluUpGradF{}, d.p, g.p, nullptr, o2.p, int64_t(n));
  for (size_t i = 0; i < n; i++) {
    float x = toF32(vg[i]), up = toF32(vu[i]), dy = toF32(vd[i]), s = sig(x);
    EXPECT(same(o.p[i], fromF32<T>(dy * up * (s * (1.0f + x * (1.0f - s))))), "swiglu dgate i=%zu", i);
    EXPECT(same(o2.p[i], fromF32<T>(dy * x * s)), "swiglu dup i=%zu", i);
  }
}

// ropeKernel (rope.cu) over [B, T, H, D] against float64 rotate-half, positions offset or per row; inverse undoes it.
template <class T> void testRope(int64_t B, int64_t S, int64_t H, int64_t D, bool withPos) {
  int64_t n = B * S * H * D, half = D / 2, pairs = n / 2;
  auto vx = conv<T>(randv(size_t(n)));
  std::vector<int32_t> pos(static_cast<size_t>(B * S));
  for (size_t i = 0; i < pos.size(); i++) pos[i] = int32_t((i * 37) % 1001);
  std::vector<T> y(static_cast<size_t>(n)), back(static_cast<size_t>(n));
  const int32_t* pp = withPos ? pos.data() : nullptr;
  emuLaunch(ropeKernel<T>, gridFor(pairs), kThreads, 0, nullptr, (const T*)vx.data(), y.data(), pp, withPos, S, H, half, int64_t(5), 10000.0, double(D), false, pairs);
  emuLaunch(ropeKernel<T>, gridFor(pairs), kThreads, 0, nullptr, (const T*)y.data(), back.data(), pp, withPos, S, H, half, int64_t(5), 10000.0, double(D), true, pairs);
  double tol = sizeof(T) == 2 ? 1e-2 : 1e-6;
  for (int64_t r = 0; r < B * S * H; r++) {
    int64_t bt = r / H, t = bt % S;
    double p = withPos ? pos[size_t(bt)] : double(5 + t);
    for (int64_t i = 0; i < half; i++) {
      double a = p * std::pow(10000.0, -double(2 * i) / double(D));
      double x1 = toF32(vx[size_t(r * D + i)]), x2 = toF32(vx[size_t(r * D + i + half)]);
      double w1 = x1 * std::cos(a) - x2 * std::sin(a), w2 = x2 * std::cos(a) + x1 * std::sin(a);
      EXPECT(std::fabs(toF32(y[size_t(r * D + i)]) - w1) <= tol * (1 + std::fabs(w1)) && std::fabs(toF32(y[size_t(r * D + i + half)]) - w2) <= tol * (1 + std::fabs(w2)),
             "rope B=%ld S=%ld H=%ld D=%ld r=%ld i=%ld", long(B), long(S), long(H), long(D), long(r), long(i));
      EXPECT(std::fabs(toF32(back[size_t(r * D + i)]) - x1) <= 4 * tol * (1 + std::fabs(x1)), "rope inverse r=%ld i=%ld", long(r), long(i));
    }
  }
}

// ---- row kernels with 16-byte packs (norms, softmax, cross-entropy) ------------------------------
// Each runs twice, with the vector path allowed (NODETRON_CUDA_VECTOR unset) and not (=0), on aligned
// rows (width a multiple of the pack, pointers 16-byte aligned: the pack kernel must run), rows shifted
// by one element and odd widths (the scalar kernel must run, bit for bit as with vectors off), against
// double references. Tolerances: a sum of n f32 terms in any order is within (n-1)·u·Σ|terms| of the
// exact sum (u = 2^-24), so a value made from a few such sums over a row of `cols` is within
// (cols + 8)·u of its scale; expf/logf/rsqrtf add a few u, storing in T half an ulp of T (ulpT below
// is a whole ulp, relative).
bool g_vectorRows = true;
namespace nt::cuda { bool rowVectorLoads() { return g_vectorRows; } }
template <class T> constexpr double ulpT() { return sizeof(T) == 4 ? 0x1p-23 : std::is_same_v<T, bf16> ? 0x1p-7 : 0x1p-10; }
// The spacing of T's subnormals: below the normal range a stored value is off by up to half of it, whatever its size.
template <class T> constexpr double tinyT() { return sizeof(T) == 4 ? 0x1p-149 : std::is_same_v<T, bf16> ? 0x1p-133 : 0x1p-24; }
constexpr double kU = 0x1p-24;
template <class T> static const char* tname() { return sizeof(T) == 4 ? "f32" : std::is_same_v<T, bf16> ? "bf16" : "f16"; }
template <class T> static bool expectVec(int64_t cols, size_t shift) { return shift == 0 && cols % vecWidth<T>() == 0; }

template <class T, bool kRms> void testNormRows(int64_t rows, int64_t cols, size_t shift, bool withResidual) {
  size_t n = size_t(rows * cols);
  auto vx = conv<T>(randv(n)), vr = conv<T>(randv(n)), vw = conv<T>(randv(size_t(cols))), vb = conv<T>(randv(size_t(cols))), vg = conv<T>(randv(n));
  for (auto& v : vx) v = fromF32<T>(toF32(v) + 3.0f);  // a mean well away from 0 (the two-pass variance)
  Buf<T> x(n, shift), res(n, shift), w(size_t(cols), shift), b(size_t(cols), shift), g(n, shift);
  std::memcpy(x.p, vx.data(), n * sizeof(T)); std::memcpy(res.p, vr.data(), n * sizeof(T)); std::memcpy(w.p, vw.data(), size_t(cols) * sizeof(T));
  std::memcpy(b.p, vb.data(), size_t(cols) * sizeof(T)); std::memcpy(g.p, vg.data(), n * sizeof(T));
  const T* resP = withResidual ? res.p : nullptr;
  const T* bP = kRms ? nullptr : b.p;
  struct Out { Buf<T> sum, y, dx; std::vector<float> mean, rstd; bool vecF, vecB; };
  auto run = [&](bool allow, size_t sh) {
    g_vectorRows = allow;
    Out o{Buf<T>(n, sh), Buf<T>(n, sh), Buf<T>(n, sh), std::vector<float>(size_t(rows)), std::vector<float>(size_t(rows)), false, false};
    o.vecF = launchNormForward<T, kRms>(nullptr, x.p, resP, withResidual ? o.sum.p : nullptr, w.p, bP, o.y.p, kRms ? nullptr : o.mean.data(), o.rstd.data(), rows, cols, 1e-5f);
    const T* src = withResidual ? o.sum.p : x.p;
    o.vecB = launchNormBackward<T, kRms>(nullptr, g.p, src, w.p, kRms ? nullptr : o.mean.data(), o.rstd.data(), o.dx.p, rows, cols);
    g_vectorRows = true;
    return o;
  };
  Out on = run(true, shift), off = run(false, shift);
  const char* what = kRms ? "rmsnorm" : withResidual ? "add_layernorm" : "layernorm";
  EXPECT(on.vecF == expectVec<T>(cols, shift) && on.vecB == on.vecF && !off.vecF && !off.vecB, "%s %s %ldx%ld shift %zu: vector path %d/%d", what, tname<T>(), long(rows), long(cols), shift, on.vecF, on.vecB);
  for (const Out* o : {&on, &off})
    for (int64_t r = 0; r < rows; r++) {
      std::vector<double> src(static_cast<size_t>(cols));
      double sabs = 0;
      for (int64_t j = 0; j < cols; j++) {
        size_t i = size_t(r * cols + j);
        T st = withResidual ? fromF32<T>(toF32(vx[i]) + toF32(vr[i])) : vx[i];
        if (withResidual) EXPECT(same(o->sum.p[i], st), "%s sum r=%ld j=%ld", what, long(r), long(j));
        src[size_t(j)] = toF32(st);
        sabs += std::fabs(src[size_t(j)]);
      }
      double m = 0, v = 0;
      if (!kRms) { for (double s : src) m += s; m /= double(cols); }
      for (double s : src) v += (s - m) * (s - m);
      double rs = 1.0 / std::sqrt(v / double(cols) + 1e-5), tolRow = double(cols + 8) * kU;
      if (!kRms) EXPECT(std::fabs(o->mean[size_t(r)] - m) <= tolRow * sabs / double(cols), "%s %s mean r=%ld got %.9g want %.9g", what, tname<T>(), long(r), o->mean[size_t(r)], m);
      EXPECT(std::fabs(o->rstd[size_t(r)] - rs) <= tolRow * rs, "%s %s rstd r=%ld got %.9g want %.9g", what, tname<T>(), long(r), o->rstd[size_t(r)], rs);
      // backward from the kernel's own statistics (both paths get the same inputs)
      double mk = kRms ? 0.0 : o->mean[size_t(r)], rk = o->rstd[size_t(r)], sg = 0, sgx = 0, sgAbs = 0;
      for (int64_t j = 0; j < cols; j++) {
        double gj = double(toF32(vg[size_t(r * cols + j)])) * toF32(vw[size_t(j)]), xh = (src[size_t(j)] - mk) * rk;
        sg += gj; sgx += gj * xh; sgAbs += std::fabs(gj) * (1 + std::fabs(xh));
      }
      sg /= double(cols); sgx /= double(cols);
      for (int64_t j = 0; j < cols; j++) {
        size_t i = size_t(r * cols + j);
        double wj = toF32(vw[size_t(j)]), bj = kRms ? 0.0 : toF32(vb[size_t(j)]), d = src[size_t(j)] - m;
        double want = d * rs * wj + bj;
        double tol = tolRow * (std::fabs(d) * rs * std::fabs(wj) + std::fabs(bj) + rs * std::fabs(wj) * sabs / double(cols)) + ulpT<T>() * std::fabs(want) + tinyT<T>();
        EXPECT(std::fabs(toF32(o->y.p[i]) - want) <= tol, "%s %s y r=%ld j=%ld got %.9g want %.9g", what, tname<T>(), long(r), long(j), toF32(o->y.p[i]), want);
        double gj = double(toF32(vg[i])) * wj, xh = (src[size_t(j)] - mk) * rk;
        double dwant = rk * (gj - (kRms ? 0.0 : sg) - xh * sgx);
        double dtol = tolRow * rk * (std::fabs(gj) + (std::fabs(xh) + 1) * sgAbs / double(cols)) + ulpT<T>() * std::fabs(dwant) + tinyT<T>();
        EXPECT(std::fabs(toF32(o->dx.p[i]) - dwant) <= dtol, "%s %s dx r=%ld j=%ld got %.9g want %.9g", what, tname<T>(), long(r), long(j), toF32(o->dx.p[i]), dwant);
      }
    }
  if (!on.vecF)  // the scalar kernel ran both times: the same bits
    for (size_t i = 0; i < n; i++) EXPECT(same(on.y.p[i], off.y.p[i]) && same(on.dx.p[i], off.dx.p[i]), "%s scalar paths differ at %zu", what, i);
}

template <class T> void testSoftmaxRows(int64_t rows, int64_t cols, size_t shift, bool logSoftmax) {
  size_t n = size_t(rows * cols);
  auto vx = randv(n), vg = conv<T>(randv(n));
  for (auto& v : vx) v *= 4.0f;
  auto tx = conv<T>(vx);
  Buf<T> x(n, shift), g(n, shift);
  std::memcpy(x.p, tx.data(), n * sizeof(T)); std::memcpy(g.p, vg.data(), n * sizeof(T));
  struct Out { Buf<T> y, dx; bool vecF, vecB; };
  auto run = [&](bool allow) {
    g_vectorRows = allow;
    Out o{Buf<T>(n, shift), Buf<T>(n, shift), false, false};
    o.vecF = launchSoftmaxForward<T>(nullptr, x.p, o.y.p, rows, cols, logSoftmax);
    o.vecB = launchSoftmaxBackward<T>(nullptr, o.y.p, g.p, o.dx.p, rows, cols, logSoftmax, 0.5f);
    g_vectorRows = true;
    return o;
  };
  Out on = run(true), off = run(false);
  const char* what = logSoftmax ? "log_softmax" : "softmax";
  EXPECT(on.vecF == expectVec<T>(cols, shift) && on.vecB == on.vecF && !off.vecF, "%s %s %ldx%ld shift %zu: vector path %d", what, tname<T>(), long(rows), long(cols), shift, on.vecF);
  for (const Out* o : {&on, &off})
    for (int64_t r = 0; r < rows; r++) {
      double mx = -INFINITY, s = 0;
      for (int64_t j = 0; j < cols; j++) mx = std::max(mx, double(toF32(tx[size_t(r * cols + j)])));
      for (int64_t j = 0; j < cols; j++) s += std::exp(double(toF32(tx[size_t(r * cols + j)])) - mx);
      double lse = mx + std::log(s), tolL = double(cols + 8) * kU * (1 + std::fabs(lse));
      // backward from the stored y (the kernel's input): s2 = Σ dy·y (softmax) or Σ dy (log-softmax)
      double s2 = 0, s2abs = 0;
      for (int64_t j = 0; j < cols; j++) {
        size_t i = size_t(r * cols + j);
        double yv = toF32(o->y.p[i]), gv = toF32(vg[i]);
        s2 += logSoftmax ? gv : gv * yv; s2abs += logSoftmax ? std::fabs(gv) : std::fabs(gv * yv);
      }
      for (int64_t j = 0; j < cols; j++) {
        size_t i = size_t(r * cols + j);
        double d = double(toF32(tx[i])) - lse, want = logSoftmax ? d : std::exp(d);
        double tol = logSoftmax ? tolL + kU * std::fabs(toF32(tx[i])) + ulpT<T>() * std::fabs(want) : std::fabs(want) * (tolL + 4 * kU + ulpT<T>()) + tinyT<T>();
        EXPECT(std::fabs(toF32(o->y.p[i]) - want) <= tol, "%s %s y r=%ld j=%ld got %.9g want %.9g", what, tname<T>(), long(r), long(j), toF32(o->y.p[i]), want);
        double yv = toF32(o->y.p[i]), gv = toF32(vg[i]);
        double dwant = 0.5 * (logSoftmax ? gv - std::exp(yv) * s2 : yv * (gv - s2));
        double scaleY = logSoftmax ? std::exp(yv) : std::fabs(yv);
        double dtol = 0.5 * (double(cols + 8) * kU * scaleY * s2abs + 8 * kU * (std::fabs(gv) + scaleY * std::fabs(s2))) + ulpT<T>() * std::fabs(dwant) + tinyT<T>();
        EXPECT(std::fabs(toF32(o->dx.p[i]) - dwant) <= dtol, "%s %s dx r=%ld j=%ld got %.9g want %.9g", what, tname<T>(), long(r), long(j), toF32(o->dx.p[i]), dwant);
      }
    }
  if (!on.vecF)
    for (size_t i = 0; i < n; i++) EXPECT(same(on.y.p[i], off.y.p[i]) && same(on.dx.p[i], off.dx.p[i]), "%s scalar paths differ at %zu", what, i);
}

template <class T> void testCrossEntropyRows(int64_t rows, int64_t vocab, size_t shift) {
  size_t n = size_t(rows * vocab);
  auto vx = randv(n);
  for (auto& v : vx) v *= 3.0f;
  auto tx = conv<T>(vx);
  Buf<T> x(n, shift);
  std::memcpy(x.p, tx.data(), n * sizeof(T));
  std::vector<int32_t> t(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; r++) t[size_t(r)] = r == 1 ? -100 : int32_t((r * 7919 + 3) % vocab);  // row 1 ignored
  T dloss = fromF32<T>(0.75f);
  struct Out { std::vector<float> loss, lse; Buf<T> dx; bool vecF, vecB; };
  auto run = [&](bool allow) {
    g_vectorRows = allow;
    Out o{std::vector<float>(size_t(rows)), std::vector<float>(size_t(rows)), Buf<T>(n, shift), false, false};
    o.vecF = launchCrossEntropyForward<T>(nullptr, x.p, t.data(), o.loss.data(), o.lse.data(), rows, vocab, -100);
    o.vecB = launchCrossEntropyBackward<T, T>(nullptr, x.p, t.data(), o.lse.data(), &dloss, o.dx.p, rows, vocab, -100, 0, 0.5f);
    g_vectorRows = true;
    return o;
  };
  Out on = run(true), off = run(false);
  EXPECT(on.vecF == expectVec<T>(vocab, shift) && on.vecB == on.vecF && !off.vecF, "cross_entropy %s %ldx%ld shift %zu: vector path %d", tname<T>(), long(rows), long(vocab), shift, on.vecF);
  for (const Out* o : {&on, &off})
    for (int64_t r = 0; r < rows; r++) {
      double mx = -INFINITY, s = 0;
      for (int64_t j = 0; j < vocab; j++) mx = std::max(mx, double(toF32(tx[size_t(r * vocab + j)])));
      for (int64_t j = 0; j < vocab; j++) s += std::exp(double(toF32(tx[size_t(r * vocab + j)])) - mx);
      double lse = mx + std::log(s), tolL = double(vocab + 8) * kU * (1 + std::fabs(lse));
      int32_t tr = t[size_t(r)];
      double want = tr == -100 ? 0.0 : lse - toF32(tx[size_t(r * vocab + tr)]);
      EXPECT(std::fabs(o->lse[size_t(r)] - lse) <= tolL, "cross_entropy %s lse r=%ld got %.9g want %.9g", tname<T>(), long(r), o->lse[size_t(r)], lse);
      EXPECT(std::fabs(o->loss[size_t(r)] - want) <= tolL + kU * std::fabs(want), "cross_entropy %s loss r=%ld got %.9g want %.9g", tname<T>(), long(r), o->loss[size_t(r)], want);
    }
  // The backward has no reduction: with the same lse both paths give the same bits, and match
  // g·(exp(x - lse) - [j == t]) from the kernel's lse (expf within a few u; the store within ulpT).
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < vocab; j++) {
      size_t i = size_t(r * vocab + j);
      int32_t tr = t[size_t(r)];
      double g = tr == -100 ? 0.0 : 0.75 * 0.5, p = std::exp(double(toF32(tx[i])) - on.lse[size_t(r)]);
      double want = g * (p - (j == tr ? 1.0 : 0.0));
      EXPECT(std::fabs(toF32(on.dx.p[i]) - want) <= g * 8 * kU * (p + 1) + ulpT<T>() * std::fabs(want) + tinyT<T>(), "cross_entropy %s dlogits r=%ld j=%ld got %.9g want %.9g", tname<T>(), long(r), long(j), toF32(on.dx.p[i]), want);
      if (on.lse[size_t(r)] == off.lse[size_t(r)]) EXPECT(same(on.dx.p[i], off.dx.p[i]), "cross_entropy %s dlogits vector vs scalar r=%ld j=%ld", tname<T>(), long(r), long(j));
    }
}

static void testRowKernels() {
  long before = checks;
  // (rows, cols): aligned widths for f32 (pack 4) and 16-bit (pack 8), odd widths, and shifted rows
  for (size_t sh : {0, 1}) {
    for (int64_t c : {64, 768, 13}) {
      testNormRows<float, false>(3, c, sh, false); testNormRows<bf16, false>(3, c, sh, false); testNormRows<f16, true>(2, c, sh, false);
      testNormRows<float, false>(2, c, sh, true); testNormRows<bf16, false>(2, c, sh, true);
      testSoftmaxRows<float>(3, c, sh, false); testSoftmaxRows<bf16>(2, c, sh, true); testSoftmaxRows<f16>(2, c, sh, false);
      testCrossEntropyRows<float>(3, c, sh); testCrossEntropyRows<bf16>(3, c, sh);
    }
    testNormRows<float, true>(2, 4100, sh, false);   // 1025 f32 packs: 1024 threads, one with two packs
    testCrossEntropyRows<bf16>(2, 8200, sh);         // 1025 bf16 packs
    testSoftmaxRows<float>(2, 36, sh, true);         // 9 packs on 64 threads
  }
  testNormRows<float, false>(2, 12, 2, false);  // width a multiple of 4 but 8-byte aligned rows: scalar
  std::printf("row kernels (vector and scalar paths): %ld checks\n", checks - before);
}

int main() {
  testRowKernels();
  testOptim<float>(true); testOptim<bf16>(true); testOptim<float>(false);
  for (size_t n : {1, 3, 7, 8, 9, 33, 4097}) for (size_t sh : {0, 1}) { testMap<float>(n, sh); testMap<bf16>(n, sh); testMap<f16>(n, sh); }
  testRowSums<float>(1, 1); testRowSums<float>(1, 3); testRowSums<float>(1, 100003); testRowSums<float>(3, 20011);
  testRowSums<float>(5, 3); testRowSums<float>(64, 768); testRowSums<bf16>(2, 9000); testRowSums<f16>(7, 300);
  testSumTo({7, 11}, {1});
  testSumTo({100003}, {1});
  testSumTo({5, 300}, {5, 1});
  testSumTo({131, 7}, {7});
  testSumTo({70000, 3}, {3});
  testSumTo({4, 33, 5}, {4, 1, 5});
  testSumTo({6, 5, 7}, {5, 1});
  testSumTo({1, 8, 1, 9}, {1, 1, 1, 9});
  testSumTo({2, 1, 3}, {2, 1, 3});
  testSumTo({3, 4, 5, 6}, {4, 1, 1});
  testSumTo({3, 4, 5, 6}, {3, 1, 5, 1});
  testSumTo({2, 3, 4}, {2, 3, 1});
  testNormGrads<false>(200, 48, true); testNormGrads<false>(3, 5, true); testNormGrads<true>(200, 48, true);
  testNormGrads<false>(64, 300, true); testNormGrads<false>(70000, 3, false); testNormGrads<true>(1, 1, true);
  testBiasGelu<float>(5, 3072, 0); testBiasGelu<float>(5, 13, 0); testBiasGelu<bf16>(130, 24, 0); testBiasGelu<bf16>(3, 24, 1); testBiasGelu<f16>(2, 7, 0);
  testEpilogueFallbacks<float>(67, 29, 0); testEpilogueFallbacks<float>(130, 96, 0); testEpilogueFallbacks<bf16>(67, 29, 1);
  testEpilogueFallbacks<bf16>(200, 48, 0); testEpilogueFallbacks<f16>(9, 13, 0);
  testBinary<float>({5, 48}, {48, 1}, {0, 1}, 240, 48);
  testBinary<float>({5, 48}, {48, 1}, {1, 0}, 240, 5);
  testBinary<float>({7, 9}, {9, 1}, {0, 0}, 63, 1);
  testBinary<bf16>({4, 3, 5}, {15, 5, 1}, {5, 0, 1}, 60, 20);
  testBinary<float>({4, 3, 5}, {15, 5, 1}, {15, 5, 1}, 60, 60);
  testBinary<float>({4, 3, 5}, {0, 5, 1}, {15, 5, 1}, 15, 60);
  testBinary<float>({2, 1, 300}, {300, 7, 1}, {0, 0, 1}, 600, 300);
  testCast<float, bf16>(4099, 0); testCast<float, bf16>(4099, 1); testCast<bf16, float>(4099, 0); testCast<float, uint8_t>(4099, 0);
  for (size_t n : {1, 7, 9, 4097}) for (size_t sh : {0, 1}) { testSwiglu<float>(n, sh); testSwiglu<bf16>(n, sh); testSwiglu<f16>(n, sh); }
  testRope<float>(2, 5, 3, 8, false); testRope<float>(2, 5, 3, 8, true); testRope<bf16>(1, 7, 2, 64, true); testRope<float>(1, 300, 4, 128, false);
  testCast<int32_t, float>(4099, 0); testCast<f16, int32_t>(37, 3); testCast<uint8_t, f16>(41, 0); testCast<float, float>(9, 0);
  std::printf("%d checks, %d failures, %ld launches, %ld blocks, %ld scratch allocations\n", checks, failures, g_launches, g_blocksRun, g_allocs);
  return failures ? 1 : 0;
}
