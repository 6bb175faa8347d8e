// Native CPU kernels for MindSpore AOT custom ops (ops.Custom(func_type="aot")), fp32 only.
//
// Each entry point has MindSpore's AOT signature: inputs first, then outputs, in `params`; 0 = success.
// Rows are the last axis; every leading axis is flattened into rows. Loops over a row are written so g++ -O3
// vectorises them: erff/expf are declared `simd` below so g++ calls glibc's vector versions (libmvec), which
// math.h only declares under -ffast-math; we do not use -ffast-math, so NaN/Inf still propagate (a diverging
// run stays visible) and sums are reassociated only where `omp simd reduction` says so (-fopenmp-simd: the
// pragmas, no threads). Single-threaded on purpose: MindSpore's own thread pool already keeps the cores busy, and
// with OpenMP threads the nano step was measured slower (spinning OpenMP workers steal the cores) or, with
// OMP_WAIT_POLICY=passive, no faster (72.4 ms/step either way).
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

// The vector variants exist in glibc >= 2.35 (libmvec): _ZGV?N?v_erfcf / _ZGV?N?v_expf. Φ(x) is computed as
// erfc(−x/√2)/2, not (1 + erf(x/√2))/2, which rounds to 0 in fp32 below x ≈ −5.5 (relative error 1).
extern "C" float erfcf(float) noexcept __attribute__((simd("notinbranch")));
extern "C" float expf(float) noexcept __attribute__((simd("notinbranch")));

namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

bool all_fp32(int nparam, const char **dtypes) {
  for (int i = 0; i < nparam; ++i)
    if (std::strcmp(dtypes[i], "float32") != 0) return false;
  return true;
}

int64_t numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

// Exact GELU and its derivative Φ(h) + h·φ(h); inlined into the loops below, which g++ vectorises.
inline float gelu(float h) { return 0.5f * h * erfcf(-h * kInvSqrt2); }
inline float gelu_grad(float h) {
  return 0.5f * erfcf(-h * kInvSqrt2) + h * kInvSqrt2Pi * expf(-0.5f * h * h);
}

// y[r, i] = f(x[r, i] + b[i]) over `rows` rows of `cols` (b may be null: no bias).
template <class F>
void map_rows(const float *x, const float *b, float *y, int64_t rows, int64_t cols, F f) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
#pragma omp simd
    for (int64_t i = 0; i < cols; ++i) yr[i] = f(xr[i] + (b ? b[i] : 0.f));
  }
}

// dx[r, i] = dy[r, i] · f'(x[r, i] + b[i]); with db non-null also db[i] = Σ_r dx[r, i] (b, db null: no bias).
template <class F>
void grad_rows(const float *dy, const float *x, const float *b, float *dx, float *db, int64_t rows, int64_t cols,
               F fprime) {
  if (db) std::fill(db, db + cols, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    const float *dyr = dy + r * cols, *xr = x + r * cols;
    float *dxr = dx + r * cols;
#pragma omp simd
    for (int64_t i = 0; i < cols; ++i) dxr[i] = dyr[i] * fprime(xr[i] + (b ? b[i] : 0.f));
    if (db)
#pragma omp simd
      for (int64_t i = 0; i < cols; ++i) db[i] += dxr[i];
  }
}

}  // namespace

extern "C" {

// LayerNorm forward. In: x[..., D], gamma[D], beta[D], eps[1]. Out: y[..., D], mean[...], rstd[...].
int LayerNormFwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 7 || !all_fp32(nparam, dtypes)) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *g = static_cast<const float *>(params[1]);
  const float *b = static_cast<const float *>(params[2]);
  const float eps = *static_cast<const float *>(params[3]);
  float *y = static_cast<float *>(params[4]);
  float *mean_out = static_cast<float *>(params[5]);
  float *rstd_out = static_cast<float *>(params[6]);
  const int64_t d = shapes[0][ndims[0] - 1];
  const int64_t rows = numel(ndims[0], shapes[0]) / d;
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * d;
    float *yr = y + r * d;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < d; ++i) sum += xr[i];
    const float mean = sum / d;
    float sq = 0.f;  // two passes: the variance of centred values does not cancel
#pragma omp simd reduction(+ : sq)
    for (int64_t i = 0; i < d; ++i) {
      const float c = xr[i] - mean;
      sq += c * c;
    }
    const float rstd = 1.f / std::sqrt(sq / d + eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] - mean) * rstd * g[i] + b[i];
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
  return 0;
}

// LayerNorm backward. In: dy[..., D], x[..., D], gamma[D], mean[...], rstd[...]. Out: dx, dgamma[D], dbeta[D].
// dx = rstd · (dy·γ − mean(dy·γ) − x̂ · mean(dy·γ·x̂)); dγ = Σ dy·x̂; dβ = Σ dy (sums over rows).
int LayerNormBwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 8 || !all_fp32(nparam, dtypes)) return 1;
  const float *dy = static_cast<const float *>(params[0]);
  const float *x = static_cast<const float *>(params[1]);
  const float *g = static_cast<const float *>(params[2]);
  const float *mean = static_cast<const float *>(params[3]);
  const float *rstd = static_cast<const float *>(params[4]);
  float *dx = static_cast<float *>(params[5]);
  float *dg = static_cast<float *>(params[6]);
  float *db = static_cast<float *>(params[7]);
  const int64_t d = shapes[1][ndims[1] - 1];
  const int64_t rows = numel(ndims[1], shapes[1]) / d;
  std::fill(dg, dg + d, 0.f);
  std::fill(db, db + d, 0.f);
  std::vector<float> xhat(d);
  for (int64_t r = 0; r < rows; ++r) {
    const float *dyr = dy + r * d;
    const float *xr = x + r * d;
    const float m = mean[r], s = rstd[r];
    float a = 0.f, c = 0.f;
#pragma omp simd reduction(+ : a, c)
    for (int64_t i = 0; i < d; ++i) {
      xhat[i] = (xr[i] - m) * s;
      const float gi = dyr[i] * g[i];
      a += gi;
      c += gi * xhat[i];
      dg[i] += dyr[i] * xhat[i];
      db[i] += dyr[i];
    }
    a /= d;
    c /= d;
    float *dxr = dx + r * d;
    for (int64_t i = 0; i < d; ++i) dxr[i] = s * (dyr[i] * g[i] - a - xhat[i] * c);
  }
  return 0;
}

// Exact GELU forward: y = x · Φ(x), Φ(x) = erfc(−x / √2) / 2. In: x. Out: y.
int GeluFwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 2 || !all_fp32(nparam, dtypes)) return 1;
  const int64_t n = numel(ndims[0], shapes[0]);
  map_rows(static_cast<const float *>(params[0]), nullptr, static_cast<float *>(params[1]), 1, n, gelu);
  return 0;
}

// Exact GELU backward: dx = dy · (Φ(x) + x · φ(x)). In: dy, x. Out: dx.
int GeluBwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 3 || !all_fp32(nparam, dtypes)) return 1;
  const int64_t n = numel(ndims[1], shapes[1]);
  grad_rows(static_cast<const float *>(params[0]), static_cast<const float *>(params[1]), nullptr,
            static_cast<float *>(params[2]), nullptr, 1, n, gelu_grad);
  return 0;
}

// Bias add (nn.Dense's BiasAdd). In: x[N, C], b[C]. Out: y = x + b.
int BiasAddFwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 3 || !all_fp32(nparam, dtypes)) return 1;
  const int64_t c = shapes[0][ndims[0] - 1], rows = numel(ndims[0], shapes[0]) / c;
  map_rows(static_cast<const float *>(params[0]), static_cast<const float *>(params[1]),
           static_cast<float *>(params[2]), rows, c, [](float h) { return h; });
  return 0;
}

// Its backward for the bias: db = Σ_rows dy (dx = dy needs no kernel). In: dy[N, C]. Out: db[C].
int BiasAddBwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 2 || !all_fp32(nparam, dtypes)) return 1;
  const float *dy = static_cast<const float *>(params[0]);
  float *db = static_cast<float *>(params[1]);
  const int64_t c = shapes[0][ndims[0] - 1], rows = numel(ndims[0], shapes[0]) / c;
  std::fill(db, db + c, 0.f);
  for (int64_t r = 0; r < rows; ++r)
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) db[i] += dy[r * c + i];
  return 0;
}

// Bias add then exact GELU in one pass (the MLP's first Dense). In: x[N, C], b[C]. Out: y = gelu(x + b).
int BiasGeluFwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 3 || !all_fp32(nparam, dtypes)) return 1;
  const int64_t c = shapes[0][ndims[0] - 1], rows = numel(ndims[0], shapes[0]) / c;
  map_rows(static_cast<const float *>(params[0]), static_cast<const float *>(params[1]),
           static_cast<float *>(params[2]), rows, c, gelu);
  return 0;
}

// Its backward. In: dy, x, b. Out: dx = dy · gelu'(x + b), db = Σ_rows dx.
int BiasGeluBwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 5 || !all_fp32(nparam, dtypes)) return 1;
  const int64_t c = shapes[1][ndims[1] - 1], rows = numel(ndims[1], shapes[1]) / c;
  grad_rows(static_cast<const float *>(params[0]), static_cast<const float *>(params[1]),
            static_cast<const float *>(params[2]), static_cast<float *>(params[3]), static_cast<float *>(params[4]),
            rows, c, gelu_grad);
  return 0;
}

// Causal softmax of scaled attention scores. In: s[..., T, T], scale[1]. Out: p[..., T, T] with
// p[t, j] = softmax_j≤t(scale · s[t, j]) and 0 above the diagonal (the causal mask, without a mask tensor).
int CausalSoftmaxFwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 3 || !all_fp32(nparam, dtypes)) return 1;
  const float *s = static_cast<const float *>(params[0]);
  const float scale = *static_cast<const float *>(params[1]);
  float *p = static_cast<float *>(params[2]);
  const int64_t t_len = shapes[0][ndims[0] - 1];
  const int64_t rows = numel(ndims[0], shapes[0]) / t_len;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t valid = r % t_len + 1;  // query position t sees keys 0..t
    const float *sr = s + r * t_len;
    float *pr = p + r * t_len;
    float mx = sr[0] * scale;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 1; j < valid; ++j) mx = mx > sr[j] * scale ? mx : sr[j] * scale;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < valid; ++j) {
      pr[j] = expf(sr[j] * scale - mx);
      sum += pr[j];
    }
    const float inv = 1.f / sum;
    for (int64_t j = 0; j < valid; ++j) pr[j] *= inv;
    for (int64_t j = valid; j < t_len; ++j) pr[j] = 0.f;
  }
  return 0;
}

// Its backward. In: dp, p. Out: ds = scale · p · (dp − Σ_j dp·p) (zero above the diagonal, where p is 0).
// The scale is an input too, so the op receives it; see CausalSoftmaxFwd.
int CausalSoftmaxBwd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam != 4 || !all_fp32(nparam, dtypes)) return 1;
  const float *dp = static_cast<const float *>(params[0]);
  const float *p = static_cast<const float *>(params[1]);
  const float scale = *static_cast<const float *>(params[2]);
  float *ds = static_cast<float *>(params[3]);
  const int64_t t_len = shapes[1][ndims[1] - 1];
  const int64_t rows = numel(ndims[1], shapes[1]) / t_len;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t valid = r % t_len + 1;
    const float *dpr = dp + r * t_len;
    const float *pr = p + r * t_len;
    float *dsr = ds + r * t_len;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < valid; ++j) dot += dpr[j] * pr[j];
    for (int64_t j = 0; j < valid; ++j) dsr[j] = scale * pr[j] * (dpr[j] - dot);
    for (int64_t j = valid; j < t_len; ++j) dsr[j] = 0.f;
  }
  return 0;
}

// The core clock, measured (helpers/run/peaks.py's hardware peak multiplies by it). A chain of dependent integer
// adds retires one add a cycle on every x86-64 and AArch64 core (an ALU add's latency is one cycle; each add needs
// the one before it, so no core runs the chain faster, and the loop's own counter runs beside it). The addend is a
// register, not an immediate: some renamers (Intel's Golden Cove) fold an add of a small immediate away. So adds a
// second are cycles a second: the clock this core runs at now, turbo included, whatever /proc/cpuinfo says.
// Returns the fastest of `repeats` timed loops of about `adds` adds each, in Hz (other load and time slicing only
// slow a loop), or 0 where this target has no such loop (the caller then names its clock a lower bound).
double WbCoreClockHz(int64_t adds, int repeats) {
#if defined(__x86_64__) || defined(__aarch64__)
  constexpr int64_t kBlock = 256;  // the adds in one `.rept` below
  const int64_t blocks = std::max<int64_t>(1, adds / kBlock);
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    uint64_t x = 0;
    const uint64_t one = 1;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < blocks; ++b) {
#if defined(__x86_64__)
      asm volatile(".rept 256\n\taddq %1, %0\n\t.endr" : "+r"(x) : "r"(one));
#else
      asm volatile(".rept 256\n\tadd %0, %0, %1\n\t.endr" : "+r"(x) : "r"(one));
#endif
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0.0 && x == static_cast<uint64_t>(blocks * kBlock)) best = std::max(best, double(blocks * kBlock) / s);
  }
  return best;
#else
  (void)adds;
  (void)repeats;
  return 0.0;
#endif
}

}  // extern "C"
