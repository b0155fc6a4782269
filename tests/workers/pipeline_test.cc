// Pipeline stages (workers/pipeline_schedule.h, pipeline_stage.h,
// pipeline_actor.h): the schedules' lists (each micro-batch forward then
// backward once, the activations they hold, the bubble they leave, against
// the formula (p - 1) / (m + p - 1)); the balanced cut; and the pipelined
// MLP against the unsplit one run through the same micro-batch loop in this
// file: the same weights and optimizer state, bit for bit, for p = 1 to 4
// stages, both schedules, and with messages delayed, duplicated and
// reordered on the way.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include "common/hash.h"
#include "kernels/kernels.h"
#include "workers/dense_parameters.h"
#include "workers/dlrm_model.h"
#include "workers/mlp.h"
#include "workers/pipeline_actor.h"
#include "workers/pipeline_schedule.h"
#include "transport/local_network.h"
#include "transport/remote_actors.h"

namespace troupe::workers {
namespace {

using Op = PipeInstr::Op;
constexpr PipelineSchedule kSchedules[] = {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B};

TEST(PipelineSchedule, EveryMicroBatchGoesForwardThenBackwardOnceAndHoldsWhatTheScheduleSays) {
  for (PipelineSchedule schedule : kSchedules) {
    for (int p = 1; p <= 5; ++p) {
      for (int m = 1; m <= 9; ++m) {
        for (int s = 0; s < p; ++s) {
          const auto list = pipelineInstructions(schedule, p, s, m);
          ASSERT_EQ(list.size(), size_t(2 * m));
          std::vector<int> forwardAt(size_t(m), -1), backwardAt(size_t(m), -1);
          int lastBackward = -1;
          for (int i = 0; i < int(list.size()); ++i) {
            auto& at = list[size_t(i)].op == Op::kForward ? forwardAt : backwardAt;
            ASSERT_EQ(at[size_t(list[size_t(i)].microBatch)], -1) << "twice";
            at[size_t(list[size_t(i)].microBatch)] = i;
            if (list[size_t(i)].op == Op::kBackward) {
              EXPECT_EQ(list[size_t(i)].microBatch, lastBackward + 1) << "backwards in micro-batch order";
              lastBackward = list[size_t(i)].microBatch;
            }
          }
          for (int i = 0; i < m; ++i) EXPECT_LT(forwardAt[size_t(i)], backwardAt[size_t(i)]);
          const int expected = schedule == PipelineSchedule::kGpipe ? m : std::min(p - s, m);
          EXPECT_EQ(peakInFlight(list), expected) << pipelineScheduleName(schedule) << " p " << p << " m " << m << " s " << s;
        }
      }
    }
  }
  EXPECT_EQ(pipelineScheduleOf("1f1b"), PipelineSchedule::k1F1B);
  EXPECT_FALSE(pipelineScheduleOf("zb-h1"));
  EXPECT_THROW(pipelineInstructions(PipelineSchedule::kGpipe, 2, 2, 4), SetupError);
  EXPECT_THROW(pipelineInstructions(PipelineSchedule::kGpipe, 2, 0, 0), SetupError);
}

TEST(PipelineSchedule, WithEqualStepsEachStageIdlesForTheBubbleOfTheFormula) {
  for (PipelineSchedule schedule : kSchedules) {
    for (int p = 1; p <= 4; ++p) {
      for (int m : {1, 2, 4, 8, 16, 32}) {
        const auto idle = pipelineBubble(schedule, p, m);
        ASSERT_EQ(idle.size(), size_t(p)) << "every list finishes";
        const double formula = double(p - 1) / double(m + p - 1);
        for (double i : idle) EXPECT_NEAR(i, formula, 1e-12) << pipelineScheduleName(schedule) << " p " << p << " m " << m;
      }
    }
  }
  // A backward twice a forward: the same share (every step scales alike).
  const auto idle = pipelineBubble(PipelineSchedule::k1F1B, 4, 8, 2.0);
  ASSERT_EQ(idle.size(), 4u);
  for (double i : idle) EXPECT_NEAR(i, 3.0 / 11.0, 1e-12);
}

TEST(PipelineSchedule, TheCutKeepsTheLargestStageAsSmallAsAnyCutCan) {
  const std::vector<std::vector<int64_t>> models = {
      {784, 256, 256, 10}, {20, 16, 12, 8, 5}, {8, 100, 2, 100, 2, 100, 4}, {3, 3, 3, 3, 3, 3}};
  for (const auto& widths : models) {
    const int layers = int(widths.size()) - 1;
    std::vector<int64_t> params;
    for (int l = 0; l < layers; ++l) params.push_back(widths[size_t(l)] * widths[size_t(l) + 1] + widths[size_t(l) + 1]);
    for (int p = 1; p <= layers; ++p) {
      const auto cut = cutMlpLayers(widths, p);
      ASSERT_EQ(cut.size(), size_t(p) + 1);
      EXPECT_EQ(cut.front(), 0);
      EXPECT_EQ(cut.back(), layers);
      int64_t largest = 0;
      for (int s = 0; s < p; ++s) {
        ASSERT_LT(cut[size_t(s)], cut[size_t(s) + 1]) << "every stage holds a layer";
        int64_t sum = 0;
        for (int l = cut[size_t(s)]; l < cut[size_t(s) + 1]; ++l) sum += params[size_t(l)];
        largest = std::max(largest, sum);
      }
      // Every cut into p stages, by brute force over the p - 1 boundaries.
      int64_t best = INT64_MAX;
      for (uint32_t mask = 0; mask < (1u << (layers - 1)); ++mask) {
        if (__builtin_popcount(mask) != p - 1) continue;
        int64_t sum = 0, worst = 0;
        for (int l = 0; l < layers; ++l) {
          sum += params[size_t(l)];
          if (l == layers - 1 || (mask >> l) & 1u) {
            worst = std::max(worst, sum);
            sum = 0;
          }
        }
        best = std::min(best, worst);
      }
      EXPECT_EQ(largest, best) << "p " << p;
    }
  }
  EXPECT_THROW(cutMlpLayers({4, 3, 2}, 3), SetupError);
}

// ---------------------------------------------------------------- training

const std::vector<int64_t> kWidths = {20, 16, 12, 8, 5};  // four layers, five classes

kernels::OptimizerConfig adam() {
  kernels::OptimizerConfig o;
  o.kind = kernels::OptimizerKind::kAdam;
  o.learningRate = 0.01f;
  return o;
}

BatchPtr randomBatch(int64_t rows, uint64_t seed) {
  auto b = std::make_shared<Batch>();
  Rng rng(seed);
  b->rows = rows;
  b->denseWidth = kWidths.front();
  b->dense.resize(size_t(rows * b->denseWidth));
  for (auto& x : b->dense) x = float(rng.normal());
  for (int64_t i = 0; i < rows; ++i) b->classes.push_back(int32_t(rng.below(uint64_t(kWidths.back()))));
  return b;
}

// The unsplit model through the micro-batch loop: per micro-batch a forward,
// the loss's gradient times rows / R, a backward adding to the gradients
// (but the first); then one optimizer step.
struct Unsplit {
  std::unique_ptr<kernels::Kernels> k = kernels::createKernels({kernels::Device::kCpu, 1});
  DenseParameters params{Mlp::parameterCount(kWidths), adam()};
  Mlp mlp{kWidths, false, &params, 0};
  Unsplit() { mlp.initialize(7); }
  // With replicas: each a share of contiguous rows through the same loop
  // (the loss over all the batch's rows), their gradients then summed in
  // replica order.
  void step(int64_t step, const Batch& b, int m, int replicas = 1) {
    std::vector<float> sum;
    for (int r = 0; r < replicas; ++r) {
      const int64_t from = b.rows * r / replicas, count = b.rows * (r + 1) / replicas - from;
      for (int i = 0; i < m; ++i) {
        const int64_t first = from + count * i / m, rows = count * (i + 1) / m - count * i / m;
        ASSERT_TRUE(mlp.forward(*k, b.dense.data() + first * b.denseWidth, rows).isOk());
        std::vector<float> d(size_t(rows * kWidths.back()));
        ASSERT_TRUE(
            k->softmaxCrossEntropy(mlp.output(), b.classes.data() + first, rows, kWidths.back(), d.data()).hasValue());
        const float share = float(rows) / float(b.rows);
        for (float& v : d) v *= share;
        ASSERT_TRUE(mlp.backward(*k, d.data(), nullptr, i > 0).isOk());
      }
      if (replicas == 1) break;
      if (r == 0) {
        sum.assign(params.grads(), params.grads() + params.size());
      } else {
        for (int64_t i = 0; i < params.size(); ++i) sum[size_t(i)] += params.grads()[i];
      }
    }
    if (replicas > 1) std::copy(sum.begin(), sum.end(), params.grads());
    ASSERT_TRUE(params.apply(*k, step).isOk());
  }
};

std::vector<PipelineStageOptions> stagesOf(int p, int m, PipelineSchedule schedule) {
  return mlpStageOptions(kWidths, cutMlpLayers(kWidths, p), m, schedule, adam(), 1);
}

// Each stage's weights and optimizer state against its slice of the
// unsplit model's, bit for bit.
void expectSameBits(InProcessPipeline& pipe, const Unsplit& ref, const std::string& what) {
  const int64_t total = ref.params.size();
  const int slots = kernels::optimizerStateSlots(ref.params.optimizer().kind);
  for (int s = 0; s < pipe.stages(); ++s) {
    DenseParameters& p = pipe.stage(s).parameters();
    const int64_t at = pipe.stage(s).parameterOffset(), n = p.size();
    for (int slot = 0; slot <= slots; ++slot) {
      ASSERT_EQ(std::memcmp(p.block() + slot * n, ref.params.block() + slot * total + at, size_t(n) * 4), 0)
          << what << ": stage " << s << (slot == 0 ? " weights" : " optimizer state");
    }
  }
}

void loadWeights(InProcessPipeline& pipe, const Unsplit& ref) {
  for (int s = 0; s < pipe.stages(); ++s) {
    DenseParameters& p = pipe.stage(s).parameters();
    std::copy_n(ref.params.weights() + pipe.stage(s).parameterOffset(), p.size(), p.weights());
  }
}

TEST(Pipeline, EveryScheduleAndCutGivesTheUnsplitModelsBits) {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  for (PipelineSchedule schedule : kSchedules) {
    for (int p = 1; p <= 4; ++p) {
      for (int m : {1, 3, 4, 8}) {
        const std::string what = std::string(pipelineScheduleName(schedule)) + " p " + std::to_string(p) + " m " +
                                 std::to_string(m);
        Unsplit ref;
        InProcessPipeline pipe(system, stagesOf(p, m, schedule));
        loadWeights(pipe, ref);
        for (int64_t step = 1; step <= 4; ++step) {
          // (the fourth batch is short, as an epoch's last may be: 5 rows, fewer than 8 micro-batches)
          const BatchPtr batch = randomBatch(step == 4 ? 5 : 26, uint64_t(step) * 101 + uint64_t(m));
          ref.step(step, *batch, m);
          auto loss = pipe.step(step, batch);
          ASSERT_TRUE(loss.hasValue()) << what << ": " << loss.status().message();
          EXPECT_GT(*loss, 0.0) << what;
          expectSameBits(pipe, ref, what + " step " + std::to_string(step));
          if (HasFatalFailure()) return;
        }
        for (int s = 0; s < p; ++s) {
          const int held = schedule == PipelineSchedule::kGpipe ? m : std::min(p - s, m);
          EXPECT_EQ(pipe.stage(s).peakHeld(), held) << what << " stage " << s;
        }
      }
    }
  }
}

// Data parallelism: replicas of the pipeline, each on a share of the batch,
// their stages' gradients summed before every replica's optimizer step:
// every replica ends each step with the bits of the unsplit model run
// through the same shares and micro-batches.
TEST(Pipeline, ReplicasOfAPipelineStayEqualAndGiveTheUnsplitModelsBits) {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  for (PipelineSchedule schedule : kSchedules) {
    for (int replicas : {2, 3}) {
      for (int p : {1, 2, 4}) {
        const int m = 3;
        const std::string what = std::string(pipelineScheduleName(schedule)) + " replicas " + std::to_string(replicas) +
                                 " p " + std::to_string(p);
        std::vector<PipelineStageOptions> all;
        for (int r = 0; r < replicas; ++r) {
          for (auto& o : stagesOf(p, m, schedule)) all.push_back(std::move(o));
        }
        Unsplit ref;
        InProcessPipeline pipe(system, std::move(all), nullptr, std::chrono::seconds(60), replicas);
        ASSERT_EQ(pipe.stages(), p);
        pipe.loadWeights(ref.params.weights());
        for (int64_t step = 1; step <= 3; ++step) {
          // (the second batch: 7 rows, fewer than 3 x 3 micro-batches; the
          // third 2, fewer than 3 replicas: one share is empty)
          const BatchPtr batch = randomBatch(step == 3 ? 2 : step == 2 ? 7 : 25, uint64_t(step) * 17 + uint64_t(replicas));
          if (step == 2) {
            // A schedule's new rate reaches every replica.
            ref.params.setLearningRate(0.004f);
            pipe.setLearningRate(0.004f);
          }
          ref.step(step, *batch, m, replicas);
          auto loss = pipe.step(step, batch);
          ASSERT_TRUE(loss.hasValue()) << what << ": " << loss.status().message();
          const int64_t total = ref.params.size();
          for (int r = 0; r < replicas; ++r) {
            for (int s = 0; s < p; ++s) {
              DenseParameters& mine = pipe.stage(s, r).parameters();
              for (int slot = 0; slot <= 2; ++slot) {
                ASSERT_EQ(std::memcmp(mine.block() + slot * mine.size(),
                                      ref.params.block() + slot * total + pipe.stage(s, r).parameterOffset(),
                                      size_t(mine.size()) * 4),
                          0)
                    << what << " step " << step << " replica " << r << " stage " << s << " slot " << slot;
              }
            }
          }
        }
      }
    }
  }
  // Options that do not make equal replicas are refused before any actor starts.
  auto three = stagesOf(3, 2, PipelineSchedule::kGpipe);
  EXPECT_THROW(InProcessPipeline(system, std::move(three), nullptr, std::chrono::seconds(5), 2), SetupError);
}

// A link that delays each message by 0 to 3 ms and sends a third of them
// twice: micro-batches arrive out of order, late and doubled, and the
// stages still end every step with the unsplit model's bits.
TEST(Pipeline, DelayedDuplicatedAndReorderedMessagesChangeNothing) {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  auto mu = std::make_shared<std::mutex>();
  auto rng = std::make_shared<std::mt19937>(11);
  auto sent = std::make_shared<int>(0), doubled = std::make_shared<int>(0);
  StageLink link = [mu, rng, sent, doubled](caf::event_based_actor* self, const caf::actor& to, StageMessagePtr m) {
    int copies = 1, delay[2] = {0, 0};
    {
      std::lock_guard lock(*mu);
      copies = (*rng)() % 3 == 0 ? 2 : 1;
      for (int& d : delay) d = int((*rng)() % 4);
      ++*sent;
      *doubled += copies - 1;
    }
    for (int c = 0; c < copies; ++c) self->delayed_send(to, std::chrono::milliseconds(delay[c]), m);
  };
  for (PipelineSchedule schedule : kSchedules) {
    const int p = 4, m = 6;
    Unsplit ref;
    InProcessPipeline pipe(system, stagesOf(p, m, schedule), link, std::chrono::seconds(60));
    loadWeights(pipe, ref);
    for (int64_t step = 1; step <= 4; ++step) {
      const BatchPtr batch = randomBatch(24, uint64_t(step) * 7);
      ref.step(step, *batch, m);
      auto loss = pipe.step(step, batch);
      ASSERT_TRUE(loss.hasValue()) << loss.status().message();
      expectSameBits(pipe, ref, std::string(pipelineScheduleName(schedule)) + " step " + std::to_string(step));
    }
  }
  std::lock_guard lock(*mu);
  // 4 stages, 6 micro-batches: 3 activations and 3 gradients each, 4 steps, 2 schedules.
  EXPECT_EQ(*sent, 2 * 4 * 6 * 6);
  EXPECT_GT(*doubled, 20) << "the link doubled messages";
}

TEST(Pipeline, AMessageOfTheWrongShapeIsRefusedNamingIt) {
  auto opts = stagesOf(2, 2, PipelineSchedule::kGpipe);
  PipelineStage stage(opts[1]);
  ASSERT_TRUE(stage.beginStep(1, randomBatch(8, 1)).isOk());
  StageMessage m;
  m.kind = StageMessage::Kind::kActivation;
  m.step = 1;
  m.microBatch = 0;
  m.rows = 4;
  m.values.assign(4 * 3, 0.5f);  // the stage takes 4 rows of its input width, not 3
  EXPECT_TRUE(stage.deliver(m));
  EXPECT_FALSE(stage.deliver(m)) << "a second copy is dropped";
  Status s = stage.run([](StageMessage&&) {});
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.message();
  EXPECT_NE(s.message().find("the activation of micro-batch 0 of step 1 holds 12 values of 4 rows"), std::string::npos)
      << s.message();
  m.microBatch = 2;  // only micro-batches 0 and 1
  EXPECT_FALSE(stage.deliver(m));
  m.microBatch = 1;
  m.step = 3;  // no neighbour is two steps ahead
  EXPECT_FALSE(stage.deliver(m));
  m.step = 2;
  EXPECT_TRUE(stage.deliver(m)) << "one step ahead is kept";
  EXPECT_EQ(stage.beginStep(2, randomBatch(1, 2)).code(), Status::Code::kInternal) << "step 1 is not done";
}

// A resumed job's stages start at the checkpoint's step, and a
// neighbour's first message may come before its stage begins: a stage that
// has not begun keeps a message of any step, and runs it once it begins
// that step (a job rolled back to step 105 would otherwise wait forever).
TEST(Pipeline, AStageResumedAtALaterStepKeepsTheMessagesThatComeFirst) {
  auto opts = stagesOf(2, 2, PipelineSchedule::k1F1B);
  PipelineStage first(opts[0]), last(opts[1]);
  const BatchPtr batch = randomBatch(8, 3);
  std::vector<StageMessage> toLast, toFirst;
  // Stage 0 resumed (its weights of step 104: asks for them are answered at once), stage 1 not yet.
  first.resumeAt(104);
  EXPECT_EQ(first.appliedStep(), 104);
  EXPECT_TRUE(first.stepDone());
  EXPECT_EQ(first.beginStep(104, batch).code(), Status::Code::kInternal) << "step 104 is done";
  ASSERT_TRUE(first.beginStep(105, batch).isOk());
  ASSERT_TRUE(first.run([&](StageMessage&& m) { toLast.push_back(std::move(m)); }).isOk());
  ASSERT_FALSE(toLast.empty());
  for (const auto& m : toLast) EXPECT_TRUE(last.deliver(m)) << "micro-batch " << m.microBatch << " before step 105 began";
  StageMessage zero = toLast.front();
  zero.step = 0;
  EXPECT_FALSE(last.deliver(zero)) << "no step 0";
  ASSERT_TRUE(last.beginStep(105, batch).isOk());
  for (int round = 0; round < 4 && !(first.stepDone() && last.stepDone()); ++round) {
    ASSERT_TRUE(last.run([&](StageMessage&& m) { toFirst.push_back(std::move(m)); }).isOk());
    for (auto& m : toFirst) first.deliver(m);
    toFirst.clear();
    toLast.clear();
    ASSERT_TRUE(first.run([&](StageMessage&& m) { toLast.push_back(std::move(m)); }).isOk());
    for (auto& m : toLast) last.deliver(m);
  }
  EXPECT_TRUE(first.stepDone());
  EXPECT_TRUE(last.stepDone());
  EXPECT_TRUE(first.applyOptimizer().isOk());
  EXPECT_TRUE(last.applyOptimizer().isOk());
  EXPECT_EQ(last.appliedStep(), 105);
}

TEST(Pipeline, AStepThatCannotFinishIsATimeoutNamingTheStages) {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  // A link that loses every gradient: the backwards wait for ever.
  StageLink lossy = [](caf::event_based_actor* self, const caf::actor& to, StageMessagePtr m) {
    if (m->kind == StageMessage::Kind::kActivation) self->send(to, m);
  };
  InProcessPipeline pipe(system, stagesOf(3, 2, PipelineSchedule::k1F1B), lossy, std::chrono::milliseconds(500));
  auto loss = pipe.step(1, randomBatch(8, 3));
  ASSERT_FALSE(loss.hasValue());
  EXPECT_EQ(loss.status().code(), Status::Code::kTimeout);
  EXPECT_NE(loss.status().message().find("stages 0, 1 still at work"), std::string::npos) << loss.status().message();
  // Some stages stepped their optimizer and others did not: the pipeline is done.
  EXPECT_TRUE(pipe.failed());
  auto next = pipe.step(2, randomBatch(8, 4));
  ASSERT_FALSE(next.hasValue());
  EXPECT_NE(next.status().message().find("step 2 after a failed step"), std::string::npos) << next.status().message();
}


}  // namespace

// The DLRM's dense part in its two stages (the bottom MLP; the interaction
// and the top MLP), the pooled embeddings passed through stage 0: with one
// micro-batch a step is the unsplit DlrmModel's, bit for bit (weights,
// optimizer state, and the pooled embeddings' gradients stage 0 gives
// back); with four, and two replicas, the same sums in another order, equal
// to rounding.
TEST(Pipeline, TheDlrmInTwoStagesGivesTheUnsplitModelsBits) {
  DlrmShape shape;
  shape.numDense = 5;
  shape.numTables = 3;
  shape.embeddingDim = 4;
  shape.bottom = {8, 4};
  shape.top = {8, 6};
  shape.concatEmbeddings = true;
  const int64_t dim = shape.embeddingDim;
  struct Case {
    int m, replicas;
    bool exact;
    int64_t rows;  // under m x replicas: some micro-batches, or a replica's share, are empty
  };
  for (const Case& c : {Case{1, 1, true, 24}, Case{4, 1, false, 24}, Case{3, 2, false, 24}, Case{8, 1, false, 5},
                        Case{3, 2, false, 5}, Case{2, 2, false, 1}}) {
    const int64_t rows = c.rows;
    for (PipelineSchedule schedule : kSchedules) {
      const std::string tag =
          fmt::format("rows {} m {} replicas {} {}", c.rows, c.m, c.replicas, pipelineScheduleName(schedule));
      auto k = kernels::createKernels({kernels::Device::kCpu, 1});
      DlrmModel ref(shape, adam(), 11);
      caf::actor_system_config cfg;
      caf::actor_system system{cfg};
      InProcessPipeline pipe(system, dlrmStageOptions(shape, c.m, schedule, adam(), 1, c.replicas), nullptr,
                             std::chrono::seconds(30), c.replicas);
      ASSERT_EQ(pipe.parameterCount(), ref.parameters().size());
      pipe.loadWeights(ref.parameters().weights());
      for (int64_t step = 1; step <= 3; ++step) {
        Rng rng(uint64_t(step) * 31);
        Batch b;
        b.rows = rows;
        b.denseWidth = shape.numDense;
        for (int64_t i = 0; i < rows * shape.numDense; ++i) b.dense.push_back(float(rng.normal()));
        for (int64_t i = 0; i < rows; ++i) b.labels.push_back(float(rng.below(2)));
        std::vector<std::vector<float>> pooled(size_t(shape.numTables), std::vector<float>(size_t(rows * dim)));
        std::vector<const float*> pooledPtrs;
        for (auto& t : pooled) {
          for (float& v : t) v = float(rng.normal()) * 0.5f;
          pooledPtrs.push_back(t.data());
        }
        // The unsplit model: the whole batch at once.
        std::vector<float> logits(static_cast<size_t>(rows)), dLogits(static_cast<size_t>(rows));
        ASSERT_TRUE(ref.forward(*k, b.dense.data(), pooledPtrs.data(), rows, logits.data()).isOk());
        ASSERT_TRUE(k->sigmoidCrossEntropy(logits.data(), b.labels.data(), rows, dLogits.data()).hasValue());
        std::vector<std::vector<float>> dPooled(size_t(shape.numTables), std::vector<float>(size_t(rows * dim)));
        std::vector<float*> dPtrs;
        for (auto& t : dPooled) dPtrs.push_back(t.data());
        ASSERT_TRUE(ref.backward(*k, dLogits.data(), dPtrs.data()).isOk());
        ASSERT_TRUE(ref.parameters().apply(*k, step).isOk());
        auto loss = pipe.step(step, dlrmStageRows(b, shape, pooledPtrs.data()));
        ASSERT_TRUE(loss.hasValue()) << tag << ": " << loss.status().message();
        // Stage 0's input gradients: [rows x (dense | e_1 .. e_T)].
        const auto in = pipe.inputGradients();
        const int64_t width = shape.numDense + shape.numTables * dim;
        ASSERT_EQ(int64_t(in.size()), rows * width) << tag;
        for (int64_t r = 0; r < rows; ++r) {
          for (int t = 0; t < shape.numTables; ++t) {
            for (int64_t d = 0; d < dim; ++d) {
              const float got = in[size_t(r * width + shape.numDense + t * dim + d)];
              const float want = dPooled[size_t(t)][size_t(r * dim + d)];
              if (c.exact) {
                ASSERT_EQ(got, want) << tag << " step " << step << " row " << r << " table " << t;
              } else {
                ASSERT_NEAR(got, want, 1e-5f + 1e-4f * std::fabs(want)) << tag << " step " << step;
              }
            }
          }
          for (int64_t d = 0; d < shape.numDense; ++d) ASSERT_EQ(in[size_t(r * width + d)], 0.0f);
        }
      }
      std::vector<float> weights(size_t(pipe.parameterCount()));
      pipe.copyWeights(weights.data());
      const float* want = ref.parameters().weights();
      for (size_t i = 0; i < weights.size(); ++i) {
        if (c.exact) {
          ASSERT_EQ(weights[i], want[i]) << tag << " weight " << i;
        } else {
          ASSERT_NEAR(weights[i], want[i], 1e-5f + 1e-4f * std::fabs(want[i])) << tag << " weight " << i;
        }
      }
      if (c.exact) {
        // The optimizer state too, stage by stage.
        const int64_t total = ref.parameters().size();
        for (int s = 0; s < 2; ++s) {
          DenseParameters& p = pipe.stage(s).parameters();
          for (int slot = 1; slot <= 2; ++slot) {
            ASSERT_EQ(std::memcmp(p.block() + slot * p.size(),
                                  ref.parameters().block() + slot * total + pipe.stage(s).parameterOffset(),
                                  size_t(p.size()) * 4),
                      0)
                << tag << " stage " << s << " slot " << slot;
          }
        }
      }
    }
  }
}

}  // namespace troupe::workers

namespace troupe::workers {
namespace {

using namespace std::chrono_literals;

// Two nodes of the transport's in-process twin (encoded and decoded as over
// UCX), each with an actor system of its own; node 1 the coordinator.
struct TwoNodes {
  std::shared_ptr<transport::LocalNetwork> net = transport::LocalNetwork::create();
  caf::actor_system_config c1, c2;
  std::unique_ptr<caf::actor_system> s1, s2;
  std::unique_ptr<transport::RemoteActors> r1, r2;  // (go before the systems)

  void start() {
    c1.set("scheduler.max-threads", 2);
    c2.set("scheduler.max-threads", 2);
    s1 = std::make_unique<caf::actor_system>(c1);
    s2 = std::make_unique<caf::actor_system>(c2);
    transport::NodeOptions o;
    o.token = "test-token";
    o.heartbeatInterval = 50ms;
    o.heartbeatTimeout = 2000ms;
    o.network = net;
    o.nodeId = 1;
    o.isCoordinator = true;
    auto a = transport::RemoteActors::start(*s1, o);
    ASSERT_TRUE(a.hasValue()) << a.status().message();
    r1 = std::move(*a);
    o.nodeId = 2;
    o.isCoordinator = false;
    o.coordinator = r1->node().address();
    auto b = transport::RemoteActors::start(*s2, o);
    ASSERT_TRUE(b.hasValue()) << b.status().message();
    r2 = std::move(*b);
    ASSERT_TRUE(r2->node().waitForMembers(2, 5s).isOk());
  }
};

// Stages on two nodes of the transport's in-process twin (encoded and
// decoded as over UCX: the activations and gradients between stages 1 and 2
// cross as raw float32 buffers, the driver's steps and the stages' answers
// as messages), each node with its own actor system: the same bits as the
// unsplit model, both schedules. Then a stage's node crashes: the step
// fails at once, naming the stage, not at the timeout.
TEST(Pipeline, StagesOnTwoNodesOfTheTransportGiveTheUnsplitModelsBits) {
  TwoNodes nodes;
  ASSERT_NO_FATAL_FAILURE(nodes.start());
  auto& net = nodes.net;
  caf::actor_system &s1 = *nodes.s1, &s2 = *nodes.s2;
  auto *r1 = &nodes.r1, *r2 = &nodes.r2;  // ((*r1)->, **r1: the node's RemoteActors)

  std::vector<caf::actor> spawned;
  for (PipelineSchedule schedule : kSchedules) {
    const int p = 4, m = 6;
    const std::string tag = pipelineScheduleName(schedule);
    std::map<int64_t, BatchPtr> batches;
    for (int64_t step = 1; step <= 4; ++step) batches[step] = randomBatch(24, uint64_t(step) * 13);
    // Every process reads the same batch for a step (here: one map).
    StageBatches source = [batches](int64_t step) { return batches.count(step) ? batches.at(step) : nullptr; };
    std::vector<std::shared_ptr<PipelineStage>> stages;
    for (auto& opt : stagesOf(p, m, schedule)) stages.push_back(std::make_shared<PipelineStage>(std::move(opt)));
    Unsplit ref;
    for (auto& st : stages) {
      std::copy_n(ref.params.weights() + st->parameterOffset(), st->parameters().size(), st->parameters().weights());
    }
    const caf::actor a0 = spawnPipelineStage(s1, stages[0], nullptr, source);
    const caf::actor a1 = spawnPipelineStage(s1, stages[1], nullptr, source);
    const caf::actor a2 = spawnPipelineStage(s2, stages[2], nullptr, source);
    const caf::actor a3 = spawnPipelineStage(s2, stages[3], nullptr, source);
    spawned.insert(spawned.end(), {a0, a1, a2, a3});
    (*r1)->publish(a1, "stage-1-" + tag);
    (*r2)->publish(a2, "stage-2-" + tag);
    (*r2)->publish(a3, "stage-3-" + tag);
    const caf::actor to2 = (*r1)->remoteActor(2, "stage-2-" + tag);
    const caf::actor to3 = (*r1)->remoteActor(2, "stage-3-" + tag);
    const caf::actor back1 = (*r2)->remoteActor(1, "stage-1-" + tag);
    caf::anon_send(a0, pipe_links_atom::value, caf::actor(), a1, false, false);
    caf::anon_send(a1, pipe_links_atom::value, a0, to2, false, true);
    caf::anon_send(a2, pipe_links_atom::value, back1, a3, true, false);
    caf::anon_send(a3, pipe_links_atom::value, a2, caf::actor(), false, false);
    PipelineDriver driver(s1, {a0, a1, to2, to3}, 30s);
    for (int64_t step = 1; step <= 3; ++step) {
      ref.step(step, *batches.at(step), m);
      auto loss = driver.step(step, {});  // the wire form: each stage reads its own batch
      ASSERT_TRUE(loss.hasValue()) << tag << ": " << loss.status().message();
      EXPECT_GT(*loss, 0.0);
      const int64_t total = ref.params.size();
      for (int s = 0; s < p; ++s) {
        DenseParameters& mine = stages[size_t(s)]->parameters();
        for (int slot = 0; slot <= 2; ++slot) {
          ASSERT_EQ(std::memcmp(mine.block() + slot * mine.size(),
                                ref.params.block() + slot * total + stages[size_t(s)]->parameterOffset(),
                                size_t(mine.size()) * 4),
                    0)
              << tag << " step " << step << " stage " << s << " slot " << slot;
        }
      }
    }
    if (schedule == PipelineSchedule::k1F1B) {
      // Node 2 crashes: stages 2 and 3 go with it, and the step says so at once.
      ASSERT_TRUE(net->crash(2));
      const auto started = std::chrono::steady_clock::now();
      auto lost = driver.step(4, {});
      ASSERT_FALSE(lost.hasValue());
      EXPECT_NE(lost.status().message().find("went during step 4"), std::string::npos) << lost.status().message();
      EXPECT_LT(std::chrono::steady_clock::now() - started, 10s) << "found by the transport, not the 30 s timeout";
      EXPECT_TRUE(driver.failed());
    }
  }
  for (auto& a : spawned) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}


// One stage a node, as a job's processes run them (ProcessStage: each
// process drives its own stage, and only the activations and gradients
// cross): the unsplit model's bits, each node assembles the whole model
// from the other's answer, and when the other node crashes mid-step the
// step fails at once naming the stage it lost. A neighbour that never
// comes up is a timeout naming it.
TEST(Pipeline, StagesDrivenInTwoProcessesGiveTheUnsplitModelsBitsAndFindALostNeighbour) {
  using namespace std::chrono_literals;
  TwoNodes nodes;
  ASSERT_NO_FATAL_FAILURE(nodes.start());
  auto& net = nodes.net;
  caf::actor_system &s1 = *nodes.s1, &s2 = *nodes.s2;
  auto *r1 = &nodes.r1, *r2 = &nodes.r2;  // ((*r1)->, **r1: the node's RemoteActors)

  const int m = 4;
  auto options = stagesOf(2, m, PipelineSchedule::k1F1B);
  auto make = [&](int s, caf::actor_system& sys, transport::RemoteActors& remote, uint64_t other) {
    ProcessStageOptions po;
    po.stage = options[size_t(s)];
    po.replicaRanks = {0, 1};
    po.replicaStages = {caf::actor(), caf::actor()};
    po.replicaStages[size_t(1 - s)] = remote.remoteActor(other, pipelineStageName(1 - s));
    po.stepTimeout = 30s;
    auto stage = std::make_unique<ProcessStage>(sys, std::move(po));
    remote.publish(stage->actor(), pipelineStageName(s));
    return stage;
  };
  auto first = make(0, s1, **r1, 2);
  // Nobody is stage 1 yet: the wait for it ends, naming it.
  Status early = first->connect(300ms);
  EXPECT_EQ(early.code(), Status::Code::kTimeout);
  EXPECT_NE(early.message().find("stage 1 (worker 1) did not answer within 300 ms"), std::string::npos)
      << early.message();
  auto second = make(1, s2, **r2, 1);
  ASSERT_TRUE(first->connect(5s).isOk());
  ASSERT_TRUE(second->connect(5s).isOk());
  Unsplit ref;
  first->loadWeights(ref.params.weights());
  second->loadWeights(ref.params.weights());
  for (int64_t step = 1; step <= 3; ++step) {
    const BatchPtr batch = randomBatch(24, uint64_t(step) * 7);
    ref.step(step, *batch, m);
    Expected<double> other = Status::internal("not run");
    std::thread t([&] { other = second->step(step, batch, nullptr); });
    auto mine = first->step(step, batch, nullptr);
    t.join();
    ASSERT_TRUE(mine.hasValue()) << mine.status().message();
    ASSERT_TRUE(other.hasValue()) << other.status().message();
    EXPECT_GT(*other, 0.0) << "the last stage's loss";
  }
  // Each node gathers the whole model: the unsplit one's bits.
  for (ProcessStage* stage : {first.get(), second.get()}) {
    std::vector<float> whole(size_t(ref.params.size()), -1.0f);
    Status s = stage->gatherWeights(whole.data(), 3, 5s);
    ASSERT_TRUE(s.isOk()) << s.message();
    EXPECT_EQ(std::memcmp(whole.data(), ref.params.weights(), whole.size() * 4), 0) << "stage " << stage->stage();
  }
  // A job resumed from that model (a checkpoint's: weights and optimizer
  // state) before any step: new stages load their slices, as of step 3, and
  // answer for that step at once; their next step is 4, the same as the
  // stages that ran on.
  {
    std::vector<float> block(size_t(ref.params.blockFloats()));
    ASSERT_TRUE(first->gatherWeights(block.data(), 3, 5s, true, ref.params.size()).isOk());
    ASSERT_EQ(std::memcmp(block.data(), ref.params.block(), block.size() * 4), 0) << "weights and optimizer state";
    auto again = [&](int s, caf::actor_system& sys, transport::RemoteActors& remote, uint64_t other) {
      ProcessStageOptions po;
      po.stage = options[size_t(s)];
      po.replicaRanks = {0, 1};
      po.replicaStages = {caf::actor(), caf::actor()};
      po.replicaStages[size_t(1 - s)] = remote.remoteActor(other, "resumed-" + pipelineStageName(1 - s));
      po.stepTimeout = 30s;
      auto stage = std::make_unique<ProcessStage>(sys, std::move(po));
      remote.publish(stage->actor(), "resumed-" + pipelineStageName(s));
      stage->loadState(block.data(), ref.params.size(), 3);
      return stage;
    };
    auto first2 = again(0, s1, **r1, 2);
    auto second2 = again(1, s2, **r2, 1);
    ASSERT_TRUE(first2->connect(5s).isOk());
    std::vector<float> whole(size_t(ref.params.size()), -1.0f);
    Status s = first2->gatherWeights(whole.data(), 3, 2s);
    ASSERT_TRUE(s.isOk()) << "a stage resumed at step 3 answers for it before any step: " << s.message();
    EXPECT_EQ(std::memcmp(whole.data(), ref.params.weights(), whole.size() * 4), 0);
    // Step 4 goes on from there as the unsplit model does (Adam's state and
    // step count included).
    const BatchPtr batch = randomBatch(24, 4 * 7);
    ref.step(4, *batch, m);
    Expected<double> other = Status::internal("not run");
    std::thread t([&] { other = second2->step(4, batch, nullptr); });
    auto mine = first2->step(4, batch, nullptr);
    t.join();
    ASSERT_TRUE(mine.hasValue()) << mine.status().message();
    ASSERT_TRUE(other.hasValue()) << other.status().message();
    s = first2->gatherWeights(whole.data(), 4, 5s);
    ASSERT_TRUE(s.isOk()) << s.message();
    EXPECT_EQ(std::memcmp(whole.data(), ref.params.weights(), whole.size() * 4), 0) << "step 4 after the resume";
  }
  // Weights of a step its neighbour has gone past are refused, naming both steps.
  std::vector<float> whole(size_t(ref.params.size()));
  Status stale = first->gatherWeights(whole.data(), 2, 5s);
  EXPECT_NE(stale.message().find("weights of step 2 asked for at step 3"), std::string::npos) << stale.message();
  // Node 2 crashes before step 4: stage 0's step finds its neighbour gone
  // at once (found by the transport), not at the timeout.
  ASSERT_TRUE(net->crash(2));
  const auto started = std::chrono::steady_clock::now();
  auto lost = first->step(4, randomBatch(24, 99), nullptr);
  ASSERT_FALSE(lost.hasValue());
  EXPECT_NE(lost.status().message().find("the stage after (worker 1) went during step 4"), std::string::npos)
      << lost.status().message();
  EXPECT_EQ(lost.status().code(), Status::Code::kUnavailable) << "a peer gone: the job's to handle";
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s) << "found by the transport, not the 30 s timeout";
  EXPECT_TRUE(first->failed());
}

}  // namespace
}  // namespace troupe::workers
