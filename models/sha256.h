// models/sha256.h: sha256 of files, in hex: the identity of a model's weight files, which tuner
// profiles and calibration sidecars are bound to.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// Lowercase hex sha256 of `prefix` followed by the bytes of `paths` in order. Throws tessera::Error
// naming a file that cannot be read.
std::string sha256_hex(std::string_view prefix, const std::vector<std::string>& paths);
// sha256_hex("", paths), remembered per file list, sizes and modification times: a 7B model's files
// take seconds to hash, and one run asks again and again (the tuner checks the calibration sidecar at
// each candidate's load; serve hashes for the profile and for the sidecar).
std::string files_sha256(const std::vector<std::string>& paths);

}  // namespace tessera
