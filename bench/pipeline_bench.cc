// Pipeline stages (workers/pipeline_actor.h) measured against what they
// should cost, in the same run: for p stages and m micro-batches, each
// stage's idle share of a step (the bubble) beside the formula
// (p - 1) / (m + p - 1), the micro-batches of activations each stage held
// at most beside min(p - s, m) (1f1b) and m (gpipe), and the steps per
// second beside the unsplit model's micro-batch loop on one thread; then
// the cost of a micro-batch message (a model so small that the messages are
// all there is).
//
// The model: an MLP of `--layers` equal layers of `--width` (the last one's
// outputs are its classes), cut evenly, so that every stage computes alike
// as the formula assumes; each stage computes on one thread (its own
// kernels), so p stages need p cores to overlap.
//
//   troupe_pipeline_bench [--width=512] [--layers=4] [--rows=64] [--steps=20]
//                         [--stages=2,4] [--micro=4,8,16,32]
//
// Prints Markdown tables.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>

#include "common/hash.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/kernels.h"
#include "workers/dense_parameters.h"
#include "workers/mlp.h"
#include "workers/pipeline_actor.h"

namespace {

using namespace troupe;
using namespace troupe::workers;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int> listOf(const char* text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

BatchPtr batchOf(int64_t rows, int64_t width, uint64_t seed) {
  auto b = std::make_shared<Batch>();
  Rng rng(seed);
  b->rows = rows;
  b->denseWidth = width;
  b->dense.resize(size_t(rows * width));
  for (auto& x : b->dense) x = float(rng.normal());
  for (int64_t i = 0; i < rows; ++i) b->classes.push_back(int32_t(rng.below(uint64_t(width))));
  return b;
}

kernels::OptimizerConfig sgd() {
  kernels::OptimizerConfig o;
  o.kind = kernels::OptimizerKind::kSgd;
  o.learningRate = 0.001f;
  return o;
}

// The unsplit model's micro-batch loop, one thread: seconds a step.
double unsplitSeconds(const std::vector<int64_t>& widths, int64_t rows, int m, int steps) {
  auto k = kernels::createKernels({kernels::Device::kCpu, 1});
  DenseParameters params(Mlp::parameterCount(widths), sgd());
  Mlp mlp(widths, false, &params, 0);
  mlp.initialize(1);
  std::vector<float> d;
  std::vector<BatchPtr> batches;  // made before the clock starts, as the pipelined run's
  for (int s = 0; s < steps + 3; ++s) batches.push_back(batchOf(rows * m, widths.front(), uint64_t(s)));
  auto step = [&](int64_t s) {
    const BatchPtr& b = batches[size_t(s - 1)];
    for (int i = 0; i < m; ++i) {
      const int64_t first = b->rows * i / m, n = b->rows * (i + 1) / m - first;
      (void)mlp.forward(*k, b->dense.data() + first * b->denseWidth, n);
      d.resize(size_t(n * widths.back()));
      (void)k->softmaxCrossEntropy(mlp.output(), b->classes.data() + first, n, widths.back(), d.data());
      (void)mlp.backward(*k, d.data(), nullptr, i > 0);
    }
    (void)params.apply(*k, s);
  };
  for (int s = 1; s <= 3; ++s) step(s);
  const auto t = Clock::now();
  for (int s = 4; s < 4 + steps; ++s) step(s);
  return since(t) / steps;
}

struct Measured {
  double stepSeconds = 0;
  std::vector<double> idle;   // by stage
  std::vector<int> held;      // by stage
  std::vector<double> model;  // by stage: the schedule's idle share for the stages' measured costs
};

Measured pipelined(caf::actor_system& system, const std::vector<int64_t>& widths, int p, int m,
                   PipelineSchedule schedule, int64_t rows, int steps) {
  const auto cut = cutMlpLayers(widths, p);
  auto stages = mlpStageOptions(widths, cut, m, schedule, sgd(), 1);
  InProcessPipeline pipe(system, std::move(stages));
  {
    // The unsplit model's initial weights, as `troupe train` starts them.
    DenseParameters params(Mlp::parameterCount(widths), sgd());
    Mlp(widths, false, &params, 0).initialize(1);
    pipe.loadWeights(params.weights());
  }
  std::vector<BatchPtr> batches;
  for (int s = 0; s < steps + 3; ++s) batches.push_back(batchOf(rows * m, widths.front(), uint64_t(s)));
  for (int s = 1; s <= 3; ++s) {
    if (!pipe.step(s, batches[size_t(s - 1)]).hasValue()) std::exit(1);
  }
  std::vector<double> busy0;
  for (int s = 0; s < p; ++s) busy0.push_back(pipe.stage(s).busySeconds());
  const auto t = Clock::now();
  for (int s = 4; s < 4 + steps; ++s) {
    auto loss = pipe.step(s, batches[size_t(s - 1)]);
    if (!loss.hasValue()) {
      std::fprintf(stderr, "troupe_pipeline_bench: %s\n", loss.status().message().c_str());
      std::exit(1);
    }
  }
  const double wall = since(t);
  Measured out;
  out.stepSeconds = wall / steps;
  for (int s = 0; s < p; ++s) {
    out.idle.push_back(1.0 - (pipe.stage(s).busySeconds() - busy0[size_t(s)]) / wall);
    out.held.push_back(pipe.stage(s).peakHeld());
  }
  std::vector<double> forward, backward;
  for (int s = 0; s < p; ++s) {
    forward.push_back(pipe.stage(s).meanForwardSeconds());
    backward.push_back(pipe.stage(s).meanBackwardSeconds());
  }
  out.model = pipelineIdle(schedule, m, forward, backward);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  troupe::kernels::chooseBlasCore(argv);  // the core troupe itself runs on (kernels/cpu/blas_core.h)
  int64_t width = 512, rows = 64;
  int layers = 4, steps = 20;
  std::vector<int> stageCounts = {2, 4}, micro = {4, 8, 16, 32};
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (!std::strncmp(a, "--width=", 8)) width = std::atoll(a + 8);
    else if (!std::strncmp(a, "--layers=", 9)) layers = std::atoi(a + 9);
    else if (!std::strncmp(a, "--rows=", 7)) rows = std::atoll(a + 7);
    else if (!std::strncmp(a, "--steps=", 8)) steps = std::atoi(a + 8);
    else if (!std::strncmp(a, "--stages=", 9)) stageCounts = listOf(a + 9);
    else if (!std::strncmp(a, "--micro=", 8)) micro = listOf(a + 8);
    else {
      std::fprintf(stderr, "usage: troupe_pipeline_bench [--width=W] [--layers=L] [--rows=R] [--steps=N] "
                           "[--stages=2,4] [--micro=4,8,16,32]\n");
      return 2;
    }
  }
  if (width < 2 || layers < 1 || rows < 1 || steps < 1) {
    std::fprintf(stderr, "troupe_pipeline_bench: width >= 2, layers, rows and steps >= 1\n");
    return 2;
  }
  for (int p : stageCounts) {
    if (p < 1 || p > layers) {
      std::fprintf(stderr, "troupe_pipeline_bench: %d stages for %d layers\n", p, layers);
      return 2;
    }
  }
  const std::vector<int64_t> widths(size_t(layers) + 1, width);
  for (int p : stageCounts) {
    if (unsigned(p) > std::thread::hardware_concurrency()) {
      std::fprintf(stderr, "troupe_pipeline_bench: warning: %d stages on %u hardware threads cannot all compute at "
                           "once: the idle shares below are the threads', not the schedule's\n",
                   p, std::thread::hardware_concurrency());
    }
  }
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  std::printf("MLP of %d layers of %lld, %lld rows a micro-batch, %d steps (after 3), one thread a stage; %u "
              "hardware threads\n\n",
              layers, (long long)width, (long long)rows, steps, std::thread::hardware_concurrency());
  // The bubble is the busiest stage's idle share (the others wait for it
  // besides: the first stage's backward skips its input's gradient, the
  // last computes the loss).
  // model: pipelineIdle with each stage's measured forward and backward
  // times (what the schedule leaves idle for these unequal stages, with
  // messages free); measured - model is what the messages and threads cost.
  std::printf("| schedule | p | m | formula | model (busiest) | measured (busiest) | measured / formula | measured - "
              "model | idle by stage, measured (model) %% | held by stage | steps/s | x unsplit |\n| --- | ---: | ---: | "
              "---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |\n");
  for (PipelineSchedule schedule : {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B}) {
    for (int p : stageCounts) {
      for (int m : micro) {
        const Measured r = pipelined(system, widths, p, m, schedule, rows, steps);
        const double unsplit = unsplitSeconds(widths, rows, m, steps);
        const double formula = double(p - 1) / double(m + p - 1);
        // The busiest stage: the one the model leaves least idle.
        const size_t busiest = size_t(std::min_element(r.model.begin(), r.model.end()) - r.model.begin());
        std::string held, idle;
        char buf[64];
        for (int s = 0; s < p; ++s) {
          std::snprintf(buf, sizeof buf, "%s%.1f (%.1f)", s ? " " : "", r.idle[size_t(s)] * 100, r.model[size_t(s)] * 100);
          idle += buf;
          if (!held.empty()) held += ' ';
          held += std::to_string(r.held[size_t(s)]);
        }
        std::printf("| %s | %d | %d | %.1f%% | %.1f%% | %.1f%% | %.2f | %+.1f pts | %s | %s | %.1f | %.2f |\n",
                    pipelineScheduleName(schedule), p, m, formula * 100, r.model[busiest] * 100, r.idle[busiest] * 100,
                    formula > 0 ? r.idle[busiest] / formula : 0.0, (r.idle[busiest] - r.model[busiest]) * 100,
                    idle.c_str(), held.c_str(), 1.0 / r.stepSeconds, unsplit / r.stepSeconds);
        std::fflush(stdout);
      }
    }
  }
  // The messages alone: a model of 8 wide layers, one row a micro-batch
  // (its compute is a few microseconds a step): the step's wall over its
  // messages, driver and optimizer included, bounds a message's cost.
  if (layers >= 2) {
    const std::vector<int64_t> tiny(size_t(layers) + 1, 8);
    const int p = 2, m = 32;
    const Measured r = pipelined(system, tiny, p, m, PipelineSchedule::k1F1B, 1, steps * 5);
    const double messages = 2.0 * (p - 1) * m;  // an activation and a gradient each boundary, each micro-batch
    std::printf("\nmessages: %d stages, %d micro-batches of 1 row of width 8: %.1f us a step, at most %.1f us a "
                "micro-batch message (the step's wall, compute and driver included, over its %.0f messages)\n",
                p, m, r.stepSeconds * 1e6, r.stepSeconds * 1e6 / messages, messages);
  }
  return 0;
}
