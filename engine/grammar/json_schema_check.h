// engine/grammar/json_schema_check.h: checks a JSON schema against the keywords the grammar engine
// enforces, before it is compiled. xgrammar skips some keywords with only a log line (uniqueItems,
// not, multipleOf on numbers, ...); a skipped keyword would let the model produce output that breaks
// a constraint the user gave, so each one is an error naming the keyword and where it is.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace tessera::grammar_detail {

// Throws GrammarError(where, message) for a keyword outside the enforced set, a keyword the engine
// would ignore where it stands (beside $ref, enum, anyOf, ...), or an invalid value. `where` is the
// dotted path of the keyword from the schema's root, after `prefix` (e.g. "properties.age.minimum").
// Rewrites, in place, the formats whose xgrammar pattern is looser than the format (ipv4, date, time,
// date-time) into a stricter "pattern".
void check_json_schema(nlohmann::ordered_json& schema, const std::string& prefix = "");

// Parses `text` as a schema and checks it (rewriting it as above); throws GrammarError("", ...) when
// it is not JSON.
nlohmann::ordered_json parse_and_check_json_schema(const std::string& text);

// Checks every {"type": "json_schema", "json_schema": ...} format inside a structural tag.
void check_structural_tag_schemas(nlohmann::ordered_json& tag, const std::string& prefix = "");

}  // namespace tessera::grammar_detail
