#pragma once
// Activation-scale calibration for int8: the float activations of every int8 tensor (the network
// input, each stage's output but the logits) on n images, sampled, then one scale per tensor by
// the calibration method (calibrate_scale). Two forwards produce those activations:
//   Stages   float_forward, plain CPU loops over the int8 plan (the CPU-only path)
//   Network  the training Network built from the folded specs, in eval mode and FP32 on ex's
//            device (the GPU path; on the CPU it serves the tests that compare the two)
// Both see the same values up to float summation order, and both sample the same positions
// (every k-th value in image order, whatever the chunking), so they give the same scales up to
// that rounding.
#include <cstddef>
#include <vector>

#include "layers/fold_batchnorm.h"
#include "layers/quant/quant_model.h"
#include "runtime/exec.h"

namespace cnn {

enum class CalibrationForward { Stages, Network };

// One scale per int8 tensor: [0] the network input, [i + 1] the output of plan[i] (i + 1 <
// plan.size()). x: n images (n, C, H, W), normalized floats in host memory.
std::vector<float> calibrate_activation_scales(const std::vector<QuantStage>& plan,
                                               const FoldedNetwork& folded, const Shape& input_chw,
                                               const float* x, int n, CalibrationMethod method,
                                               const Exec& ex, CalibrationForward forward);

// For each stage of the plan, the node of a Network built from `folded_specs` (an index into
// its layers()) whose output is the stage's output: the last of the stage's own layer and the
// layers it fuses, in graph order. Throws naming a stage whose layers the network lacks.
std::vector<size_t> stage_output_nodes(const std::vector<QuantStage>& plan,
                                       const std::vector<LayerSpec>& folded_specs);

}  // namespace cnn
