// Every configuration key troupe understands, with its default and meaning.
// A key not listed here is refused by name when it appears in a file or --set.
#include "common/config.h"

namespace troupe {

std::vector<Config::Key> troupeConfigSchema() {
  using T = Config::Type;
  using R = Config::Range;
  auto closed = [](double lo, double hi) { return R{lo, hi, false, false}; };
  auto leftOpen = [](double lo, double hi) { return R{lo, hi, true, false}; };
  // 2^53: every integer up to it is exact in a double, the type of a range
  // (seeds and clocks go up to here).
  constexpr double kMaxExactInt = 9007199254740992.0;
  return {
      // ---- run ----
      {"run.threads", T::kInt, int64_t{0}, "compute threads (OpenBLAS and kernels); 0 = all cores", closed(0, 4096)},
      {"run.seed", T::kInt, int64_t{1}, "seed for initialisation and shuffling", closed(0, kMaxExactInt)},
      {"run.dir", T::kString, std::string("runs"), "where run directories are made"},
      {"run.name", T::kString, std::string(""), "run directory name; empty = <time>-<model>"},
      {"log.level", T::kString, std::string("info"), "trace, debug, info, warn, error, critical, off"},
      // ---- data ----
      {"data.kind", T::kString, std::string("criteo-synthetic"),
       "criteo-synthetic, criteo, libsvm or fashion-mnist"},
      {"data.train", T::kString, std::string(""), "training file (criteo, libsvm) or directory (fashion-mnist)"},
      {"data.test", T::kString, std::string(""), "test file (criteo, libsvm)"},
      {"data.cache_dir", T::kString, std::string("cache/data"),
       "where generated data sets are kept (criteo-synthetic)"},
      {"data.on_bad_record", T::kString, std::string("fail"),
       "a malformed record (a line of a Criteo TSV file): fail = the job fails naming the file and the line; skip = "
       "it is dropped, the first few logged, and the summary counts them (bad_records)",
       {}, {"fail", "skip"}},
      {"data.skip_bad_lines", T::kBool, false,
       "removed (kept so that older run directories load): true means data.on_bad_record = skip"},
      {"data.categorical", T::kInt, int64_t{26}, "categorical columns per Criteo line", closed(1, 4096)},
      {"data.max_train_rows", T::kInt, int64_t{-1}, "read at most this many training rows; -1 = all", closed(-1, 1e+15)},
      {"data.in_memory", T::kBool, true, "keep parsed training batches (a worker: its share) after the first epoch (with train.epochs = 1: none)"},
      {"data.prefetch", T::kInt, int64_t{4}, "batches the loader reads ahead", closed(1, 1024)},
      // ---- model ----
      {"model.kind", T::kString, std::string("dlrm"),
       "dlrm, mlp, or count (the exact-count model: on Criteo-format data every update adds the times each key occurs, by plain SGD at rate 1, and the final evaluation checks every value against counts of the data)"},
      {"model.embedding_dim", T::kInt, int64_t{16}, "DLRM embedding dimension", closed(1, 65536)},
      {"model.bottom_mlp", T::kIntList, std::vector<int64_t>{64, 16},
       "DLRM bottom MLP widths after the dense input; the last must equal embedding_dim", closed(1, 1048576)},
      {"model.top_mlp", T::kIntList, std::vector<int64_t>{128, 64},
       "DLRM top MLP hidden widths (a final width of 1 is added)", closed(1, 1048576)},
      {"model.embedding_init_scale", T::kFloat, 0.0,
       "new embedding rows are uniform in +-scale; 0 = 1/sqrt(embedding_dim)", closed(0, 100)},
      {"model.concat_embeddings", T::kBool, true,
       "DLRM: also feed the embeddings themselves to the top MLP (first-order terms)"},
      {"model.hidden", T::kIntList, std::vector<int64_t>{256, 128}, "MLP classifier hidden widths", closed(1, 1048576)},
      {"model.classes", T::kInt, int64_t{10}, "MLP classifier classes", closed(1, 1000000)},
      // ---- training ----
      {"train.epochs", T::kInt, int64_t{1}, "passes over the training data", closed(1, 1000000)},
      {"train.batch_size", T::kInt, int64_t{256}, "examples per step", closed(1, 16777216)},
      {"train.max_steps", T::kInt, int64_t{0}, "stop after this many steps; 0 = no limit", closed(0, 1e+12)},
      {"train.dense_optimizer", T::kString, std::string("adam"), "sgd, adagrad, adam or ftrl (dense weights)"},
      {"train.dense_lr", T::kFloat, 0.001, "dense learning rate", leftOpen(0, 100)},
      {"train.embedding_optimizer", T::kString, std::string("adagrad"),
       "sgd, adagrad, adam or ftrl (embedding rows, applied by the table holder)"},
      {"train.embedding_lr", T::kFloat, 0.5, "embedding learning rate", leftOpen(0, 100)},
      {"train.adagrad_initial_accumulator", T::kFloat, 1e-3,
       "Adagrad's starting accumulator (dense and embedding rows), a prior of about this much squared gradient", closed(0, 1e6)},
      {"train.lr_decay", T::kFloat, 1.0,
       "dense learning rate multiplied by this after every epoch (ps mode: each push carries it to the shards, "
       "which hold the dense optimizer)", leftOpen(0, 1)},
      {"train.weight_decay", T::kFloat, 0.0, "L2 (sgd) or decoupled (adam) weight decay of dense weights", closed(0, 1)},
      {"train.eval_each_epoch", T::kBool, true, "evaluate on the test set after every epoch, not only the last"},
      {"train.eval_every_steps", T::kInt, int64_t{0},
       "also evaluate on the test set every this many steps while training (worker 0's; beside it, on a snapshot); "
       "0 = not by steps", closed(0, 1e+12)},
      {"train.eval_every_seconds", T::kFloat, 0.0,
       "also evaluate on the test set every this many seconds of training (worker 0's); 0 = not by time", closed(0, 1e9)},
      {"train.progress_every", T::kInt, int64_t{100}, "steps between progress reports", closed(1, 1e+12)},
      {"train.profile", T::kBool, false,
       "one process: time every compute kernel call of training (not the evaluations); the summary's kernel_profile "
       "and the log say where the step's compute went"},
      // ---- synthetic Criteo generator ----
      {"data.synthetic.rows", T::kInt, int64_t{3'000'000}, "training rows", closed(1, 1e+12)},
      {"data.synthetic.test_rows", T::kInt, int64_t{0}, "test rows; 0 = rows / 10", closed(0, 1e+12)},
      {"data.synthetic.seed", T::kInt, int64_t{1}, "generator seed (same seed, same bytes)", closed(0, kMaxExactInt)},
      {"data.synthetic.tables", T::kInt, int64_t{26}, "categorical tables (columns)", closed(1, 4096)},
      {"data.synthetic.min_vocab", T::kInt, int64_t{10}, "vocabulary of the smallest table", closed(1, 1e+10)},
      {"data.synthetic.max_vocab", T::kInt, int64_t{1'000'000}, "vocabulary of the largest table", closed(1, 1e+10)},
      {"data.synthetic.zipf", T::kFloat, 1.1, "Zipf exponent of categorical values", leftOpen(0, 10)},
      {"data.synthetic.factor_dim", T::kInt, int64_t{4}, "dimension of the planted pairwise factors", closed(0, 1024)},
      {"data.synthetic.ctr", T::kFloat, 0.25, "target click-through rate", R{0, 1, true, true}},
      {"data.synthetic.weight_scale", T::kFloat, 0.45, "std of a frequent value's planted weight", closed(0, 100)},
      {"data.synthetic.factor_scale", T::kFloat, 0.65, "scale of the planted pairwise factors", closed(0, 100)},
      {"data.synthetic.dense_scale", T::kFloat, 0.2, "std of each integer feature's planted term", closed(0, 100)},
      {"data.synthetic.rare_rank", T::kFloat, 20.0,
       "values past this rank carry less signal, by (1 + rank / rare_rank)^-rare_shrink", leftOpen(0, 1e9)},
      {"data.synthetic.rare_shrink", T::kFloat, 2.0, "how fast signal fades with rank (see rare_rank)", closed(0, 100)},
      // ---- cluster: a multi-process job (parameter-server mode) ----
      {"cluster.workers", T::kInt, int64_t{0},
       "worker processes; 0 = the whole job in this process (every role an actor, no transport)", closed(0, 256)},
      {"cluster.servers", T::kInt, int64_t{2}, "parameter-server processes (each one shard)", closed(0, 256)},
      {"cluster.start_timeout_s", T::kInt, int64_t{120}, "every process must join the coordinator within this", closed(1, 86400)},
      {"cluster.worker_threads", T::kInt, int64_t{0}, "compute threads per worker process; 0 = cores / workers", closed(0, 1024)},
      {"cluster.server_threads", T::kInt, int64_t{1}, "compute threads per parameter-server process", closed(1, 1024)},
      {"cluster.generation", T::kInt, int64_t{0},
       "set by the coordinator: how often the job has rolled back to a checkpoint (shards refuse what workers of an "
       "older generation still send)", closed(0, 1e+09)},
      {"cluster.slow_worker", T::kInt, int64_t{-1},
       "removed (kept so that older run directories load): use a slow fault, --fault kind=slow,target=worker:N,...", closed(-1, 256)},
      {"cluster.slow_ms", T::kInt, int64_t{0}, "removed: see cluster.slow_worker", closed(0, 3600000)},
      {"ps.consistency", T::kString, std::string("bsp"),
       "bsp (every step sees every worker's previous step), ssp (at most ps.staleness steps ahead) or asp",
       {}, {"bsp", "ssp", "asp"}},
      {"ps.staleness", T::kInt, int64_t{4}, "ssp: how many steps a worker may run ahead of the slowest", closed(0, 1e+09)},
      {"ps.stale_lr", T::kString, std::string("none"),
       "none, or inverse: an ASP / SSP push's learning rate divided by its staleness + 1 (the updates its gradient "
       "missed)"},
      {"ps.delay_compensation", T::kFloat, 0.0,
       "lambda of DC-ASGD for ASP / SSP pushes: g + lambda * g * g * (w_now - w_stale); 0 = off (the shards keep "
       "each training pull's rows until its push)", closed(0, 1e6)},
      {"ps.replicas", T::kInt, int64_t{1},
       "copies of every shard: 1, or 2 (primary and backup in two ps processes; a push is acknowledged once both "
       "applied it, and a lost primary's backup takes over without a rollback). ps and hybrid modes, "
       "cluster.servers >= 2", closed(1, 2)},
      {"cluster.fresh_start", T::kBool, false,
       "set by the coordinator: this sync-mode worker starts the job again from step 0 with every other rank (its "
       "group lost every worker holding the model and had no checkpoint)"},
      {"cluster.ps_rebuild", T::kBool, false,
       "set by the coordinator: this ps process replaces a lost one, and its copies of the shards are built from "
       "their primaries (ps.replicas = 2)"},
      // ---- faults injected on purpose (actors/fault_plan.h; README, Fault plans) ----
      {"faults.seed", T::kInt, int64_t{1}, "every random choice of the fault plan (ranks, times) comes from this", closed(0, kMaxExactInt)},
      {"faults.start_unix_ms", T::kInt, int64_t{0},
       "set by the coordinator: the wall-clock moment (ms since 1970) the message faults' at_s counts from, the same "
       "for every process of the job (0: when the process joined)", closed(0, kMaxExactInt)},
      {"faults.plan", T::kStringList, std::vector<std::string>{},
       "faults to inject, one 'field=value,...' each: [[faults]] tables, or troupe train --fault SPEC"},
      // ---- checkpoints of a multi-process job (every train.mode; sync modes with the ring backend) ----
      {"checkpoint.every_steps", T::kInt, int64_t{0},
       "write a checkpoint whenever the slowest worker has taken this many steps since the last; 0 = not by steps", closed(0, 1e+12)},
      {"checkpoint.every_seconds", T::kInt, int64_t{0}, "write a checkpoint this often; 0 = not by time", closed(0, 31536000)},
      {"checkpoint.dir", T::kString, std::string(""),
       "where checkpoints go; empty = <run directory>/checkpoints (across machines: a directory every ps and "
       "worker process reaches at the same path)"},
      {"checkpoint.keep", T::kInt, int64_t{2}, "complete checkpoints kept (older ones are removed)", closed(1, 1000)},
      {"checkpoint.resume", T::kString, std::string(""),
       "set by troupe train --resume: the checkpoint directory the job goes on from"},
      // ---- supervision: what a multi-process job does when a process fails ----
      {"supervision.on_worker_loss", T::kString, std::string("restart"),
       "restart (a new process takes the lost worker's rank: in ps mode it resumes its share of the data from its "
       "last step the shards applied; in allreduce / hybrid mode with the ring the group forms again with it, it "
       "copies the model from a survivor, and the step under way is redone), shrink (no new process: in ps mode the "
       "live worker process running the fewest ranks takes the lost rank as well and resumes its share where the "
       "shards left it; in allreduce and hybrid mode with the ring the others form the group without it, redo the "
       "step and divide what is left of the data among themselves, hybrid with BSP shards only, which first undo "
       "the step the lost rank may have left half pushed) or fail (the job ends, naming the worker)",
       {}, {"restart", "shrink", "fail"}},
      {"supervision.max_restarts", T::kInt, int64_t{3},
       "restarts of one rank allowed within supervision.restart_window_s; one more fails the job", closed(0, 1000000)},
      {"supervision.restart_window_s", T::kInt, int64_t{300}, "see supervision.max_restarts", closed(1, 31536000)},
      {"supervision.replace_timeout_s", T::kInt, int64_t{120},
       "a lost rank must be taken by a new process within this (a local job starts one at once; across machines, "
       "start one with troupe launch --role worker --rank N)", closed(1, 604800)},
      {"supervision.stall_timeout_s", T::kInt, int64_t{300},
       "a worker alive but reporting no step this long while it trains is declared hung, killed by PID (a local job) "
       "and handled as lost; a pull waits at most 2 x (this + replace_timeout_s) for a slower worker's step", closed(1, 604800)},
      // ---- training mode of a multi-process job ----
      {"train.mode", T::kString, std::string("ps"),
       "ps (every parameter on the parameter servers), allreduce (every worker holds the dense parameters and a "
       "replica of the tables; gradients averaged by all-reduce) or hybrid (tables on the parameter servers, dense "
       "parameters by all-reduce)"},
      {"train.bucket_kb", T::kInt, int64_t{256},
       "allreduce / hybrid: dense gradients are reduced in buckets of about this size, each as soon as backward has "
       "produced it", closed(1, 1048576)},
      {"collectives.backend", T::kString, std::string("ring"),
       "allreduce / hybrid: ring (over the transport), nccl (every worker needs a CUDA device and a troupe built "
       "with NCCL; host buffers are staged through the device) or auto (nccl when every worker can use it, else the "
       "ring)"},
      // ---- pipeline stages (DESIGN.md, Pipeline stages) ----
      {"pipeline.stages", T::kInt, int64_t{1},
       "the MLP cut into this many stages by layers, each a stage actor; activations go forward and gradients back "
       "as messages, micro-batch by micro-batch (1: no pipeline); in a job of processes (cluster.workers = stages x "
       "replicas, train.mode = allreduce) a worker process a stage", closed(1, 64)},
      {"pipeline.replicas", T::kInt, int64_t{1},
       "data parallelism: this many copies of the pipeline, each on a share of every batch, each stage's gradients "
       "summed over its copies before the optimizer step (in a job of processes by the ring of the stage's "
       "processes) (1: one pipeline)", closed(1, 64)},
      {"pipeline.micro_batches", T::kInt, int64_t{4},
       "pipeline.stages > 1 or pipeline.replicas > 1: micro-batches each replica's share of a batch is cut into "
       "(micro_batches x replicas at most train.batch_size)", closed(1, 4096)},
      {"pipeline.schedule", T::kString, std::string("1f1b"),
       "pipeline.stages > 1: gpipe (every forward, then every backward) or 1f1b (one forward, one backward in turn: "
       "stage s holds at most stages - s micro-batches of activations)"},
      {"pipeline.cut", T::kString, std::string(""),
       "pipeline.stages > 1: the first layer of each stage after the first, e.g. \"1,2\" (layers from 0); empty: "
       "balanced by parameter count"},
      // ---- gradient compression (DESIGN.md, Compression; multi-process jobs) ----
      {"compression.push", T::kString, std::string("none"),
       "ps / hybrid: the gradients a worker pushes to the shards (embedding rows and dense), encoded with error "
       "feedback: none, fp16, bf16, int8, onebit, topk or randomk"},
      {"compression.pull", T::kString, std::string("none"),
       "ps / hybrid: the weights shards send back for a training pull: none, fp16 or bf16 (casts: weights are sent "
       "whole every time, with no residual)"},
      {"compression.allreduce", T::kString, std::string("none"),
       "allreduce / hybrid: the dense gradients' all-reduce: none, fp16, bf16 (reduced in the ring as they are), "
       "int8, onebit (reduce-scatter of encoded segments, summed in float32, encoded again, all-gathered), topk "
       "(all-gather of index-value pairs) or randomk (the same indices on every rank, summed in the ring); the nccl "
       "backend takes none, fp16 and bf16"},
      {"compression.warmup_steps", T::kInt, int64_t{0}, "the first steps of every worker go uncompressed", closed(0, 1e+12)},
      {"compression.fraction", T::kFloat, 0.01, "topk, randomk: the share of the values sent, in (0, 1]", leftOpen(0, 1)},
      {"compression.chunk", T::kInt, int64_t{256}, "int8, onebit: values per scale", closed(1, 1048576)},
      {"compression.residual_rows", T::kInt, int64_t{2000000},
       "compression.push: a worker keeps a residual row for every embedding key it pushed, at most this many (all "
       "tables; 0 = no bound; a single push larger than it still gets its rows); a push whose new keys would pass "
       "it drops them all first (logged: a bounded loss of what they held back)", closed(0, 1e+12)},
      {"collectives.chunk_kb", T::kInt, int64_t{512}, "ring all-reduce: pieces of a segment in flight at once", closed(1, 1048576)},
      {"collectives.small_kb", T::kInt, int64_t{32},
       "all-reduces up to this size use recursive doubling (latency) on power-of-two groups", closed(0, 1048576)},
      {"collectives.timeout_s", T::kInt, int64_t{600},
       "a collective that waits this long fails (a dead peer is found sooner, by the transport's heartbeats); in a "
       "job of processes at most half of supervision.stall_timeout_s, so that a rank waiting for a stuck peer gives up "
       "before that peer is found hung", closed(1, 604800)},
      {"collectives.spin_us", T::kInt, int64_t{50}, "a waiting collective polls this long before it sleeps", closed(0, 1000000)},
      // ---- transport (between processes; the job token: transport.token_file or TROUPE_JOB_TOKEN) ----
      {"transport.token_file", T::kString, std::string(""),
       "a file holding the job's secret token (mode 0600, this user's; `troupe token --out FILE` makes one); empty = "
       "the TROUPE_JOB_TOKEN environment variable"},
      {"transport.listen_host", T::kString, std::string("127.0.0.1"),
       "the only address this process listens on; a concrete IPv4 address its peers can reach"},
      {"transport.listen_port", T::kInt, int64_t{0}, "the port to listen on; 0 = any free port", closed(0, 65535)},
      {"transport.heartbeat_interval_ms", T::kInt, int64_t{250}, "heartbeat to each idle peer this often", closed(1, 3600000)},
      {"transport.heartbeat_timeout_ms", T::kInt, int64_t{3000},
       "a peer silent this long is down: monitors get a down message and its pending requests fail", closed(2, 86400000)},
      {"transport.handshake_timeout_ms", T::kInt, int64_t{1000},
       "a connection must finish the token handshake within this, or it is closed (an idle connection holds a slot)", closed(1, 3600000)},
      {"transport.handshake_slots", T::kInt, int64_t{256},
       "accepted connections in their handshake at once; when full, a new one takes the slot of the oldest that has "
       "sent nothing (or no proof) and is older than a quarter of transport.handshake_timeout_ms, from the host "
       "holding the most, and is refused when there is none",
       closed(1, 4096)},
      {"transport.handshake_slots_per_host", T::kInt, int64_t{64},
       "the same, for the connections from one host (so one host cannot take every slot)", closed(1, 4096)},
      {"transport.join_timeout_ms", T::kInt, int64_t{30000},
       "keep trying to reach the coordinator this long (it may start later)", closed(0, 86400000)},
      {"transport.shared_memory", T::kBool, true,
       "peers on one host use UCX shared memory (failures seen by heartbeats); false = TCP with UCX peer error handling"},
      {"transport.spin_us", T::kInt, int64_t{50},
       "the progress thread polls this long after its last work before it sleeps (latency against CPU)", closed(0, 1000000)},
      {"transport.integrity", T::kString, std::string("crc32c"),
       "how each frame between processes is guarded after the handshake: crc32c = a CRC32C against bits flipped on "
       "the way; hmac = an HMAC-SHA256 seal under keys of the connection's own, also against anyone without the "
       "token who can alter, forge or replay traffic (jobs across hosts on a shared network); off = nothing (and "
       "a fault plan with corrupt faults is refused); every process of a job must agree",
       {}, {"off", "crc32c", "hmac"}},
      {"transport.max_message_mb", T::kInt, int64_t{4096}, "larger incoming messages are dropped and counted", closed(1, 1048576)},
      {"transport.reliable_links", T::kBool, false,
       "number, acknowledge and resend messages per link, so that a message lost, doubled, reordered or corrupted "
       "on the way (a fault plan's message faults) still arrives once and in order; every process of a job must "
       "agree; troupe train turns it on for a plan with message faults"},
  };
}

}  // namespace troupe
