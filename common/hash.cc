#include "common/hash.h"

#include <cmath>

namespace troupe {

double Rng::normal() {
  // 1 - u keeps the argument of log in (0, 1].
  const double u1 = 1.0 - uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace troupe
