// The one-launch BatchNorm plan (batchnorm_one_pass_plan.h).
#include "kernels/norm/batchnorm_one_pass_plan.h"

namespace cnn {

BatchNormOnePassPlan plan_batchnorm_one_pass(const BatchNormShape& s) {
  BatchNormOnePassPlan best;
  const int64_t m = s.count();
  if (m < 1 || m > kBnOnePassMaxValues || s.c < 1 || s.c > kBnOnePassMaxChannels) return best;
  const auto in_wave = [&](const BatchNormOnePassPlan& p) {
    return int64_t(s.c) * p.cluster <= kBnOnePassWaveBlocks;
  };
  for (int v : kBnOnePassPerThread) {  // ascending V
    const int64_t per_block = int64_t(kBnOnePassThreads) * v;
    const int64_t r = (m + per_block - 1) / per_block;
    if (r > kBnOnePassMaxCluster) continue;
    BatchNormOnePassPlan p;
    p.fits = true;
    p.cluster = int(r);
    p.per_thread = v;
    bool better = !best.fits || p.slots() < best.slots();
    // Equal waste: keep the smaller V while its grid fits a wave; past a wave take the larger.
    if (best.fits && p.slots() == best.slots()) better = !in_wave(best);
    if (better) best = p;
  }
  return best;
}

}  // namespace cnn
