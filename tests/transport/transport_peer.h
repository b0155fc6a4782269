// The peer program of the multi-process transport tests: the test binary runs
// itself with `--peer MODE ...` to get a second (third, ...) process.
//
//   echo      joins the coordinator, publishes an "echo" actor (see
//             transport_peer.cc for what it answers) and runs until told to
//             quit or for at most --lifetime-ms.
//   coordinator  the job's coordinator on --listen; writes its port to
//             --port-file, waits for --expect-peer's echo, checks a request
//             and a 1 MiB tensor round trip, tells it to quit, exits 0.
//   badtoken  tries to join with the token it is given and exits 0 if the
//             coordinator refused it, 1 if it got in.
//   idle      opens --count UCX connections to the coordinator and sends
//             nothing on them (a slow-loris); writes how many to --port-file.
#pragma once

#include <chrono>
#include <string>

#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/message.hpp>

#include "tests/common/subprocess.h"

namespace troupe::transport::testing {

using echo_atom = caf::atom_constant<caf::atom("echo")>;
using add_atom = caf::atom_constant<caf::atom("add")>;
using seq_atom = caf::atom_constant<caf::atom("seq")>;
using seqcheck_atom = caf::atom_constant<caf::atom("seqcheck")>;
using hold_atom = caf::atom_constant<caf::atom("hold")>;
using relay_atom = caf::atom_constant<caf::atom("relay")>;
using garbage_atom = caf::atom_constant<caf::atom("garbage")>;
using quit_atom = caf::atom_constant<caf::atom("quit")>;
using whoami_atom = caf::atom_constant<caf::atom("whoami")>;
using burst_atom = caf::atom_constant<caf::atom("burst")>;
using handed_atom = caf::atom_constant<caf::atom("handed")>;

// A request from a fresh scoped actor: the reply, or the error, as a message.
// (CAF 0.17 hands a reply of a type the handler did not name to the error
// handler as unexpected_response with the reply as its context.)
caf::message ask(caf::actor_system& system, const caf::actor& dest, caf::message msg,
                 std::chrono::milliseconds timeout = std::chrono::seconds(10));

using troupe::testing::selfExe;

// Runs the peer named by argv if argv asks for one; returns -1 otherwise.
int runPeerIfAsked(int argc, char** argv);

}  // namespace troupe::transport::testing
