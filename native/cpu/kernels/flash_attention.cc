// Flash attention on the cpu backend (FlashAttention-2's algorithm): softmax(scale·q·kᵀ + mask)·v
// without the T×T scores. Forward runs tiles of kQueryTile queries (in parallel over batch × heads ×
// query tiles on the kernel pool) over blocks of kKeyTile keys with an online softmax, keeping only
// each row's running max, sum and output, and saves the per-row log-sum-exp; backward recomputes the
// probabilities of each (key block, query tile) from q, k and that log-sum-exp. The tile products are
// cblas_sgemm calls with OpenBLAS on one thread (like gemm's batches of small GEMMs). Everything is
// computed in f32 whatever the storage dtype; each (batch, head) is reduced in one fixed order, so
// results do not depend on the thread count. Extra memory: a few tiles per thread in forward, f32
// copies of one head's q, k, v, dO and dq ([T, D] each) per thread in backward -- O(T), never O(T²).
#include <cblas.h>

#include <mutex>

#include "../../core/attention_layout.h"
#include "util.h"

extern "C" {
int openblas_get_num_threads(void);
void openblas_set_num_threads(int);
}

namespace nt::cpu {

// gemm.cc: held while OpenBLAS is set to one thread (the setting is process-wide).
std::mutex& blasThreadsMutex();

namespace {

constexpr int64_t kQueryTile = 64;
constexpr int64_t kKeyTile = 64;

// One row of a score tile s[0..n) (raw q·k) -> unnormalized probabilities under the running max m and
// sum l, keys [a, b) visible (the rest get 0); returns the factor the row's earlier output is scaled by.
NT_SIMD_BODY void flashRowForwardBody(float* __restrict s, int64_t n, int64_t a, int64_t b, float scale, float* __restrict m,
                                      float* __restrict l, float* __restrict alpha) {
  float mx = -INFINITY;
  for (int64_t j = a; j < b; j++) mx = std::max(mx, s[j] * scale);
  float mNew = std::max(*m, mx);
  *alpha = 1.0f;
  if (mNew == -INFINITY) {  // nothing visible yet
    for (int64_t j = 0; j < n; j++) s[j] = 0.0f;
    return;
  }
  float al = *m == -INFINITY ? 0.0f : fastExp(*m - mNew);
  for (int64_t j = 0; j < a; j++) s[j] = 0.0f;
  for (int64_t j = b; j < n; j++) s[j] = 0.0f;
  for (int64_t j = a; j < b; j++) s[j] = fastExp(s[j] * scale - mNew);
  float sum = sumLanes(b - a, [&](int64_t j) { return s[a + j]; });
  *l = *l * al + sum;
  *m = mNew;
  *alpha = al;
}
NT_SIMD(flashRowForward, (float* __restrict s, int64_t n, int64_t a, int64_t b, float scale, float* __restrict m, float* __restrict l,
                          float* __restrict alpha),
        (s, n, a, b, scale, m, l, alpha))

// One row of a backward tile: p = exp(scale·s − lse) on the visible keys [a, b) (0 elsewhere, and
// everywhere when lse = −inf: a row that sees no key), then dS = scale·p·(dP − delta) in place of dP.
NT_SIMD_BODY void flashRowBackwardBody(float* __restrict s, float* __restrict dp, int64_t n, int64_t a, int64_t b, float scale, float lse,
                                       float delta) {
  if (lse == -INFINITY) a = b = 0;
  for (int64_t j = 0; j < a; j++) s[j] = dp[j] = 0.0f;
  for (int64_t j = std::max(a, b); j < n; j++) s[j] = dp[j] = 0.0f;
  for (int64_t j = a; j < b; j++) {
    float p = fastExp(s[j] * scale - lse);
    s[j] = p;
    dp[j] = scale * p * (dp[j] - delta);
  }
}
NT_SIMD(flashRowBackward, (float* __restrict s, float* __restrict dp, int64_t n, int64_t a, int64_t b, float scale, float lse, float delta),
        (s, dp, n, a, b, scale, lse, delta))

// Rows [t0, t0 + rows) of one head under layout L, to/from contiguous f32 [rows, D].
void loadRows(const uint8_t* base, DType dt, const HeadLayout& L, int64_t b, int64_t h, int64_t t0, int64_t rows, int64_t D, float* dst) {
  size_t es = dtypeSize(dt);
  for (int64_t r = 0; r < rows; r++) toF32(base + size_t(L.at(b, h, t0 + r)) * es, dt, dst + r * D, D);
}
void storeRows(uint8_t* base, DType dt, const HeadLayout& L, int64_t b, int64_t h, int64_t t0, int64_t rows, int64_t D, const float* src) {
  size_t es = dtypeSize(dt);
  for (int64_t r = 0; r < rows; r++) fromF32(src + r * D, base + size_t(L.at(b, h, t0 + r)) * es, dt, D);
}

// C[m, n] (+)= op(A)·op(B) on row-major f32 (leading dimensions as stored).
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), 1.0f, A, int(lda), B,
              int(ldb), beta, C, int(ldc));
}

// Runs fn(begin, end) over `tasks` on the pool with OpenBLAS on one thread (each task's GEMMs are
// small); when another caller holds the OpenBLAS setting, runs them all on this thread.
template <class F>
void parallelTasks(int64_t tasks, int64_t workPerTask, F fn) {
  std::unique_lock<std::mutex> lock(blasThreadsMutex(), std::defer_lock);
  if (kernelThreads() > 1 && tasks > 1 && lock.try_lock()) {
    int saved = openblas_get_num_threads();
    if (saved != 1) openblas_set_num_threads(1);
    parallelRows(tasks, workPerTask, fn);
    if (saved != 1) openblas_set_num_threads(saved);
  } else {
    fn(int64_t(0), tasks);
  }
}

}  // namespace

// flash_attention_forward(q, k, v, out, lse, qLayout, kLayout, vLayout, outLayout, batch, heads, tq, tk, dim,
//                         scale, causal, window, dtype)
//   out = softmax(scale·q·kᵀ + mask)·v per (batch, head), read and written through the layouts
//   (native/core/attention_layout.h); lse f32 [batch, heads, tq] gets each row's log Σ exp over its
//   visible keys (−inf, and an output row of zeros, for a query that sees no key).
NT_KERNEL("flash_attention_forward", FlashAttentionForward) {
  int64_t ext[4];
  FlashProblem p = flashProblem(a, ext, call);
  uint8_t* q = storageData(info, a.at("q", "so"), call, p.dt, ext[0]);
  uint8_t* k = storageData(info, a.at("k", "so"), call, p.dt, ext[1]);
  uint8_t* v = storageData(info, a.at("v", "so"), call, p.dt, ext[2]);
  uint8_t* o = storageData(info, a.at("out", "so"), call, p.dt, ext[3]);
  float* lse = reinterpret_cast<float*>(storageData(info, a.at("lse", "so"), call, DType::F32, p.B * p.H * p.tq));
  if (p.B == 0 || p.H == 0 || p.tq == 0) return;
  int64_t D = p.D, tiles = (p.tq + kQueryTile - 1) / kQueryTile;
  parallelTasks(p.B * p.H * tiles, 4 * kQueryTile * p.tk * std::max<int64_t>(D, 1), [&](int64_t begin, int64_t end) {
    std::vector<float> Q(size_t(kQueryTile * D)), K(size_t(kKeyTile * D)), V(size_t(kKeyTile * D)), S(size_t(kQueryTile * kKeyTile)),
        acc(size_t(kQueryTile * D)), m(kQueryTile), l(kQueryTile);
    for (int64_t task = begin; task < end; task++) {
      int64_t bh = task / tiles, b = bh / p.H, h = bh % p.H;
      int64_t i0 = (task % tiles) * kQueryTile, rows = std::min(kQueryTile, p.tq - i0);
      loadRows(q, p.dt, p.q, b, h, i0, rows, D, Q.data());
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);
      int64_t klo = p.mask.lo(i0), khi = p.mask.hi(i0 + rows - 1);
      for (int64_t j0 = klo; j0 < khi; j0 += kKeyTile) {
        int64_t cols = std::min(kKeyTile, khi - j0);
        loadRows(k, p.dt, p.k, b, h, j0, cols, D, K.data());
        loadRows(v, p.dt, p.v, b, h, j0, cols, D, V.data());
        sgemm(false, true, rows, cols, D, Q.data(), D, K.data(), D, 0.0f, S.data(), kKeyTile);
        for (int64_t r = 0; r < rows; r++) {
          int64_t i = i0 + r;
          int64_t a0 = std::clamp<int64_t>(p.mask.lo(i) - j0, 0, cols), b0 = std::clamp<int64_t>(p.mask.hi(i) - j0, 0, cols);
          float alpha;
          flashRowForward(S.data() + r * kKeyTile, cols, a0, std::max(a0, b0), p.scale, &m[size_t(r)], &l[size_t(r)], &alpha);
          if (alpha != 1.0f)
            for (int64_t d = 0; d < D; d++) acc[size_t(r * D + d)] *= alpha;
        }
        sgemm(false, false, rows, D, cols, S.data(), kKeyTile, V.data(), D, 1.0f, acc.data(), D);
      }
      float* lseRow = lse + bh * p.tq + i0;
      for (int64_t r = 0; r < rows; r++) {
        float lr = l[size_t(r)];
        float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
        for (int64_t d = 0; d < D; d++) acc[size_t(r * D + d)] *= inv;
        lseRow[r] = lr > 0.0f ? m[size_t(r)] + std::log(lr) : -INFINITY;
      }
      storeRows(o, p.dt, p.o, b, h, i0, rows, D, acc.data());
    }
  });
}

// flash_attention_backward(q, k, v, out, gradOut, lse, gradQ, gradK, gradV, qLayout, kLayout, vLayout, outLayout,
//                          batch, heads, tq, tk, dim, scale, causal, window, dtype)
//   The gradients of flash_attention_forward's output: gradOut is read through outLayout, gradQ/K/V
//   are written through the layouts of q/k/v (they may share one storage, e.g. a packed QKV
//   gradient: every element of each head's range is written, zeros where no query sees a key).
//   Per (batch, head): delta_i = Σ_d dO·O, then for each key block, for each query tile that sees it:
//   P = exp(scale·q·kᵀ − lse), dV += Pᵀ·dO, dS = scale·P∘(dO·vᵀ − delta), dK += dSᵀ·q, dQ += dS·k.
NT_KERNEL("flash_attention_backward", FlashAttentionBackward) {
  int64_t ext[4];
  FlashProblem p = flashProblem(a, ext, call);
  const uint8_t* q = storageData(info, a.at("q", "so"), call, p.dt, ext[0]);
  const uint8_t* k = storageData(info, a.at("k", "so"), call, p.dt, ext[1]);
  const uint8_t* v = storageData(info, a.at("v", "so"), call, p.dt, ext[2]);
  const uint8_t* o = storageData(info, a.at("out", "so"), call, p.dt, ext[3]);
  const uint8_t* go = storageData(info, a.at("gradOut", "so"), call, p.dt, ext[3]);
  const float* lse = reinterpret_cast<const float*>(storageData(info, a.at("lse", "so"), call, DType::F32, p.B * p.H * p.tq));
  uint8_t* gq = storageData(info, a.at("gradQ", "so"), call, p.dt, ext[0]);
  uint8_t* gk = storageData(info, a.at("gradK", "so"), call, p.dt, ext[1]);
  uint8_t* gv = storageData(info, a.at("gradV", "so"), call, p.dt, ext[2]);
  if (p.B == 0 || p.H == 0) return;
  int64_t D = p.D, tq = p.tq, tk = p.tk;
  parallelTasks(p.B * p.H, 10 * tq * tk * std::max<int64_t>(D, 1), [&](int64_t begin, int64_t end) {
    std::vector<float> Q(size_t(tq * D)), K(size_t(tk * D)), V(size_t(tk * D)), dO(size_t(tq * D)), dQ(size_t(tq * D)), delta(static_cast<size_t>(tq)),
        dK(size_t(kKeyTile * D)), dV(size_t(kKeyTile * D)), S(size_t(kQueryTile * kKeyTile)), dP(size_t(kQueryTile * kKeyTile));
    for (int64_t bh = begin; bh < end; bh++) {
      int64_t b = bh / p.H, h = bh % p.H;
      loadRows(q, p.dt, p.q, b, h, 0, tq, D, Q.data());
      loadRows(k, p.dt, p.k, b, h, 0, tk, D, K.data());
      loadRows(v, p.dt, p.v, b, h, 0, tk, D, V.data());
      loadRows(go, p.dt, p.o, b, h, 0, tq, D, dO.data());
      loadRows(o, p.dt, p.o, b, h, 0, tq, D, dQ.data());  // O, only for delta; dQ is zeroed below
      for (int64_t i = 0; i < tq; i++) {
        double s = 0;
        for (int64_t d = 0; d < D; d++) s += double(dO[size_t(i * D + d)]) * dQ[size_t(i * D + d)];
        delta[size_t(i)] = float(s);
      }
      std::fill(dQ.begin(), dQ.end(), 0.0f);
      const float* lseHead = lse + bh * tq;
      for (int64_t j0 = 0; j0 < tk; j0 += kKeyTile) {
        int64_t cols = std::min(kKeyTile, tk - j0);
        std::fill(dK.begin(), dK.end(), 0.0f);
        std::fill(dV.begin(), dV.end(), 0.0f);
        // Queries that see a key of [j0, j0 + cols): hi(i) > j0 and lo(i) < j0 + cols.
        int64_t iBegin = p.mask.causal ? std::max<int64_t>(0, j0 - (tk - tq)) : 0;
        int64_t iEnd = p.mask.window > 0 ? std::clamp<int64_t>(j0 + cols - (tk - tq) + p.mask.window - 1, 0, tq) : tq;
        for (int64_t i0 = iBegin; i0 < iEnd; i0 += kQueryTile) {
          int64_t rows = std::min(kQueryTile, iEnd - i0);
          const float* Qi = Q.data() + i0 * D;
          const float* dOi = dO.data() + i0 * D;
          sgemm(false, true, rows, cols, D, Qi, D, K.data() + j0 * D, D, 0.0f, S.data(), kKeyTile);
          sgemm(false, true, rows, cols, D, dOi, D, V.data() + j0 * D, D, 0.0f, dP.data(), kKeyTile);
          for (int64_t r = 0; r < rows; r++) {
            int64_t i = i0 + r;
            int64_t a0 = std::clamp<int64_t>(p.mask.lo(i) - j0, 0, cols), b0 = std::clamp<int64_t>(p.mask.hi(i) - j0, 0, cols);
            flashRowBackward(S.data() + r * kKeyTile, dP.data() + r * kKeyTile, cols, a0, std::max(a0, b0), p.scale, lseHead[i],
                             delta[size_t(i)]);
          }
          sgemm(true, false, cols, D, rows, S.data(), kKeyTile, dOi, D, 1.0f, dV.data(), D);
          sgemm(true, false, cols, D, rows, dP.data(), kKeyTile, Qi, D, 1.0f, dK.data(), D);
          sgemm(false, false, rows, D, cols, dP.data(), kKeyTile, K.data() + j0 * D, D, 1.0f, dQ.data() + i0 * D, D);
        }
        storeRows(gk, p.dt, p.k, b, h, j0, cols, D, dK.data());
        storeRows(gv, p.dt, p.v, b, h, j0, cols, D, dV.data());
      }
      storeRows(gq, p.dt, p.q, b, h, 0, tq, D, dQ.data());
    }
  });
}

}  // namespace nt::cpu
