#include "app/bench/bench_op_layers.h"

#include <cstddef>
#include <utility>

namespace cnn::bench {

namespace {

bool is_pool_2x2(const LayerSpec& s) {
  return s.kind == LayerKind::MaxPool2d && s.kernel_h == 2 && s.kernel_w == 2 && s.stride_h == 2 &&
         s.stride_w == 2 && s.pad_h == 0 && s.pad_w == 0;
}

}  // namespace

std::vector<OpLayer> op_layers(const std::vector<LayerSpec>& specs, const Shape& input_chw,
                               int batch) {
  const std::vector<GraphNode> graph = layer_graph(specs);
  const size_t count = graph.size();
  Shape input = {batch};
  input.insert(input.end(), input_chw.begin(), input_chw.end());

  // Readers of each node's output (an add reads its branch's end and its shortcut's end, or the
  // block's input for the identity), as the Network counts them for its folds.
  std::vector<int> consumers(count, 0);
  for (const GraphNode& g : graph)
    for (int t : {g.input, g.shortcut_input})
      if (t >= 0) ++consumers[size_t(t)];
  const auto only_reader_of = [&](size_t t, LayerKind kind) -> int {
    if (consumers[t] != 1) return -1;
    for (size_t r = t + 1; r < count; ++r)
      if (graph[r].input == int(t)) return graph[r].spec.kind == kind ? int(r) : -1;
    return -1;
  };

  std::vector<Shape> out(count);
  std::vector<bool> needs_grad(count, false);
  std::vector<OpLayer> layers;
  for (size_t i = 0; i < count; ++i) {
    const GraphNode& g = graph[i];
    const Shape& in = g.input < 0 ? input : out[size_t(g.input)];
    const bool grad_in = g.input >= 0 && needs_grad[size_t(g.input)];
    const bool grad_shortcut = g.shortcut_input >= 0 && needs_grad[size_t(g.shortcut_input)];
    if (g.spec.kind == LayerKind::Residual) {  // the add: the branch's shape, no row
      out[i] = in;
      needs_grad[i] = grad_in || grad_shortcut;
      continue;
    }
    out[i] = layer_output_shape(g.spec, in);
    needs_grad[i] = layer_param_count(g.spec, in) > 0 || grad_in;

    OpLayer l;
    l.spec = g.spec;
    l.in = in;
    l.name = g.spec.name;
    l.input_grad_needed = grad_in;
    if (g.spec.kind == LayerKind::BatchNorm2d || g.spec.kind == LayerKind::BatchNorm1d) {
      const int relu = only_reader_of(i, LayerKind::Relu);
      if (relu >= 0) {
        l.folds_relu = true;
        l.name += "+" + graph[size_t(relu)].spec.name;
      }
    }
    if (i == 0 && g.spec.kind == LayerKind::Conv2d) {
      const int relu = only_reader_of(0, LayerKind::Relu);
      const int pool = relu >= 0 ? only_reader_of(size_t(relu), LayerKind::MaxPool2d) : -1;
      if (pool >= 0 && is_pool_2x2(graph[size_t(pool)].spec))
        l.relu_pool =
            l.name + "+" + graph[size_t(relu)].spec.name + "+" + graph[size_t(pool)].spec.name;
    }
    layers.push_back(std::move(l));
  }
  return layers;
}

}  // namespace cnn::bench
