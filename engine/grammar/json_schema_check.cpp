// engine/grammar/json_schema_check.cpp: the keywords xgrammar 0.2.8's JSON-schema converter
// enforces (json_schema_converter.cc), and the checks that reject everything else by name and path.
#include "engine/grammar/json_schema_check.h"

#include <array>
#include <cmath>
#include <set>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grammar/grammar.h"

namespace tessera::grammar_detail {
namespace {

using json = nlohmann::ordered_json;
using KeywordSet = std::set<std::string, std::less<>>;

// Carried and never enforced, by JSON Schema's own definition.
const KeywordSet kAnnotations = {"title",      "default",   "description", "examples", "deprecated",
                                 "readOnly",   "writeOnly", "$comment",    "$schema",  "$id"};
const KeywordSet kNumberKeywords = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                    "multipleOf"};
const KeywordSet kStringKeywords = {"minLength", "maxLength", "pattern", "format"};
const KeywordSet kArrayKeywords = {"items", "prefixItems", "minItems", "maxItems", "unevaluatedItems"};
const KeywordSet kObjectKeywords = {"properties",    "required",      "additionalProperties",
                                    "patternProperties", "propertyNames", "minProperties",
                                    "maxProperties", "unevaluatedProperties"};
const KeywordSet kStructureKeywords = {"$ref", "$defs", "definitions", "const", "enum", "anyOf",
                                       "oneOf", "allOf", "type"};
const KeywordSet kTypes = {"object", "array", "string", "integer", "number", "boolean", "null"};
// Formats the converter turns into a pattern; any other format would be skipped.
const KeywordSet kFormats = {"email",    "date",          "time",          "date-time",
                             "duration", "ipv4",          "ipv6",          "hostname",
                             "uuid",     "uri",           "uri-reference", "uri-template",
                             "json-pointer", "relative-json-pointer"};
// The converter reads one of these per schema, in this order, and skips the rest of the schema's
// constraints; the second list of each pair is what may stand beside it without being skipped.
const std::array<std::pair<std::string_view, KeywordSet>, 6> kExclusiveKeywords = {{
    {"$ref", {"$defs", "definitions"}},
    {"const", {"type"}},
    {"enum", {"type"}},
    {"anyOf", {"$defs", "definitions"}},
    {"oneOf", {"$defs", "definitions"}},
    {"allOf", {"$defs", "definitions"}},
}};
// Formats whose xgrammar pattern admits values JSON Schema validators reject (leading zeros in an
// IPv4 byte, February 31st, a leap second at any minute) become this stricter pattern: every value
// they admit is valid. February 29th and leap seconds are left out altogether. Fractional seconds
// are "(\.[0-9]+|)", not "(\.[0-9]+)?": xgrammar 0.2.8's string regexes make the first element
// of an optional group that ends in a repetition optional too ("015" would pass for "01.5").
const std::array<std::pair<std::string_view, std::string_view>, 4> kStricterFormats = {{
    {"ipv4", R"(^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$)"},
    {"date", R"(^[0-9]{4}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)$)"},
    {"time", R"(^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+|)(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$)"},
    {"date-time", R"(^[0-9]{4}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31))"
                  R"(T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+|)(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$)"},
}};

void tighten_format(json& schema) {
  const std::string format = schema.at("format").get<std::string>();
  for (const auto& [name, pattern] : kStricterFormats) {
    if (format != name) continue;
    schema.erase("format");
    schema["pattern"] = std::string(pattern);
    return;
  }
}

// "(...)?" as "(...|)": the same language, but xgrammar 0.2.8's string regexes get the first form
// wrong when the group ends in a repetition (for "^A(-[0-9]+)?$" they admit "A1"). Lookaround
// groups, and lazy or possessive "??" / "?+", are left alone.
std::string spell_optional_groups(const std::string& pattern) {
  std::string out;
  std::vector<bool> lookaround;  // per open group
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      out += pattern.substr(i++, 2);
      continue;
    }
    if (in_class) {
      in_class = c != ']';
    } else if (c == '[') {
      in_class = true;
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[i++];  // "[]...]"
    } else if (c == '(') {
      const std::string_view next = std::string_view(pattern).substr(i + 1, 3);
      lookaround.push_back(next.starts_with("?=") || next.starts_with("?!") || next.starts_with("?<=") ||
                           next.starts_with("?<!"));
    } else if (c == ')' && !lookaround.empty()) {
      const bool plain = !lookaround.back();
      lookaround.pop_back();
      const bool optional = i + 1 < pattern.size() && pattern[i + 1] == '?';
      const bool greedy = i + 2 >= pattern.size() || (pattern[i + 2] != '?' && pattern[i + 2] != '+');
      if (plain && optional && greedy) {
        out += "|)";
        ++i;
        continue;
      }
    }
    out += c;
  }
  return out;
}

constexpr int64_t kIntegerMultipleOfMax = 1024;        // the converter's limits for multipleOf
constexpr int64_t kIntegerMultipleOfRangeWidthMax = 10000;

std::string join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

[[noreturn]] void fail(const std::string& where, const std::string& message) {
  throw GrammarError(where, message);
}

bool is_known(const std::string& key) {
  for (const KeywordSet* set : {&kAnnotations, &kNumberKeywords, &kStringKeywords, &kArrayKeywords,
                                &kObjectKeywords, &kStructureKeywords}) {
    if (set->contains(key)) return true;
  }
  return false;
}

void check_natural(const json& value, const std::string& where, std::string_view keyword) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0) {
    fail(where, "'" + std::string(keyword) + "' must be a non-negative integer");
  }
}

void check_number(const json& value, const std::string& where, std::string_view keyword) {
  if (!value.is_number()) fail(where, "'" + std::string(keyword) + "' must be a number");
}

// Of the constraints the converter reads first, only the one it reads may stand, with its allowed
// companions and annotations.
void check_exclusive(const json& schema, const std::string& path) {
  for (const auto& [keyword, companions] : kExclusiveKeywords) {
    if (!schema.contains(keyword)) continue;
    for (const auto& [key, value] : schema.items()) {
      if (key == keyword || companions.contains(key) || kAnnotations.contains(key)) continue;
      fail(join(path, key), "'" + key + "' beside '" + std::string(keyword) +
                                "' is not supported: the engine would not enforce it");
    }
    return;
  }
}

std::set<std::string> declared_types(const json& schema) {
  std::set<std::string> types;
  if (!schema.contains("type")) return types;
  const json& type = schema["type"];
  if (type.is_string()) types.insert(type.get<std::string>());
  if (type.is_array()) {
    for (const json& t : type) {
      if (t.is_string()) types.insert(t.get<std::string>());
    }
  }
  return types;
}

void check_type(const json& type, const std::string& where) {
  auto check_one = [&](const json& t) {
    if (!t.is_string() || !kTypes.contains(t.get<std::string>())) {
      fail(where, "'type' must be one of object, array, string, integer, number, boolean, null; got " +
                      t.dump());
    }
  };
  if (type.is_array()) {
    if (type.empty()) fail(where, "'type' must not be an empty list");
    for (const json& t : type) check_one(t);
  } else {
    check_one(type);
  }
}

}  // namespace

class SchemaChecker {
 public:
  void check(json& schema, const std::string& path) {
    if (schema.is_boolean()) return;
    if (!schema.is_object()) fail(path, "a schema must be an object or a boolean, got " + schema.dump());
    for (const auto& [key, value] : schema.items()) {
      if (!is_known(key)) fail(join(path, key), "keyword '" + key + "' is not supported");
    }
    check_exclusive(schema, path);
    check_structure(schema, path);
    check_untyped(schema, path);
    check_numbers(schema, path);
    check_strings(schema, path);
    check_arrays(schema, path);
    check_objects(schema, path);
  }

 private:
  void check_schema_list(json& list, const std::string& where, std::string_view keyword) {
    if (!list.is_array() || list.empty()) {
      fail(where, "'" + std::string(keyword) + "' must be a non-empty list of schemas");
    }
    for (size_t i = 0; i < list.size(); ++i) check(list[i], join(where, std::to_string(i)));
  }

  void check_schema_map(json& map, const std::string& where, std::string_view keyword) {
    if (!map.is_object()) fail(where, "'" + std::string(keyword) + "' must be an object of schemas");
    for (auto& [name, sub] : map.items()) check(sub, join(where, name));
  }

  void check_structure(json& schema, const std::string& path) {
    for (const char* defs : {"$defs", "definitions"}) {
      if (schema.contains(defs)) check_schema_map(schema[defs], join(path, defs), defs);
    }
    if (schema.contains("$ref")) {
      const json& ref = schema["$ref"];
      if (!ref.is_string() || !(ref == "#" || ref.get<std::string>().starts_with("#/"))) {
        fail(join(path, "$ref"), "'$ref' must point inside the schema (\"#\" or \"#/...\"), got " +
                                     ref.dump());
      }
    }
    if (schema.contains("enum") && (!schema["enum"].is_array() || schema["enum"].empty())) {
      fail(join(path, "enum"), "'enum' must be a non-empty list");
    }
    for (const char* keyword : {"anyOf", "oneOf", "allOf"}) {
      if (schema.contains(keyword)) check_schema_list(schema[keyword], join(path, keyword), keyword);
    }
    if (schema.contains("allOf") && schema["allOf"].size() > 1) {
      fail(join(path, "allOf"), "'allOf' with more than one schema is not supported");
    }
    if (schema.contains("type")) check_type(schema["type"], join(path, "type"));
  }

  // Without a type, the converter reads only object and array keywords (it infers the type from
  // them); a number or string keyword alone would be skipped.
  void check_untyped(const json& schema, const std::string& path) {
    if (schema.contains("type")) return;
    for (const auto& [key, value] : schema.items()) {
      if (kNumberKeywords.contains(key) || kStringKeywords.contains(key)) {
        fail(join(path, key), "'" + key + "' needs a \"type\" beside it to be enforced");
      }
    }
  }

  void check_numbers(const json& schema, const std::string& path) {
    for (const char* keyword : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (schema.contains(keyword)) check_number(schema[keyword], join(path, keyword), keyword);
    }
    if (schema.contains("multipleOf")) check_multiple_of(schema, join(path, "multipleOf"));
  }

  void check_multiple_of(const json& schema, const std::string& where) {
    const json& value = schema["multipleOf"];
    check_number(value, where, "multipleOf");
    if (declared_types(schema) != std::set<std::string>{"integer"}) {
      fail(where, "'multipleOf' is supported on \"type\": \"integer\" only");
    }
    if (!value.is_number_integer() || value.get<int64_t>() <= 0 ||
        value.get<int64_t>() > kIntegerMultipleOfMax) {
      fail(where, "'multipleOf' must be an integer from 1 to " + std::to_string(kIntegerMultipleOfMax));
    }
    const bool lower = schema.contains("minimum") || schema.contains("exclusiveMinimum");
    const bool upper = schema.contains("maximum") || schema.contains("exclusiveMaximum");
    if (lower != upper) fail(where, "'multipleOf' with a bound on one side only is not supported");
    if (lower && upper) {
      const double low = schema.value("minimum", schema.value("exclusiveMinimum", 0.0));
      const double high = schema.value("maximum", schema.value("exclusiveMaximum", 0.0));
      if (std::abs(high - low) > static_cast<double>(kIntegerMultipleOfRangeWidthMax)) {
        fail(where, "'multipleOf' over a range wider than " +
                        std::to_string(kIntegerMultipleOfRangeWidthMax) + " is not supported");
      }
    }
  }

  void check_strings(json& schema, const std::string& path) {
    for (const char* keyword : {"minLength", "maxLength"}) {
      if (!schema.contains(keyword)) continue;
      check_natural(schema[keyword], join(path, keyword), keyword);
      if (schema.contains("pattern") || schema.contains("format")) {
        fail(join(path, keyword), std::string("'") + keyword +
                                      "' beside 'pattern' or 'format' is not supported");
      }
    }
    if (schema.contains("pattern")) {
      if (!schema["pattern"].is_string()) fail(join(path, "pattern"), "'pattern' must be a string");
      schema["pattern"] = spell_optional_groups(schema["pattern"].get<std::string>());
    }
    if (schema.contains("format")) {
      const json& format = schema["format"];
      if (!format.is_string() || !kFormats.contains(format.get<std::string>())) {
        fail(join(path, "format"), "'format' " + format.dump() + " is not supported");
      }
      tighten_format(schema);
    }
  }

  void check_arrays(json& schema, const std::string& path) {
    for (const char* keyword : {"items", "unevaluatedItems"}) {
      if (schema.contains(keyword)) check(schema[keyword], join(path, keyword));
    }
    if (schema.contains("prefixItems")) {
      check_schema_list(schema["prefixItems"], join(path, "prefixItems"), "prefixItems");
    }
    for (const char* keyword : {"minItems", "maxItems"}) {
      if (schema.contains(keyword)) check_natural(schema[keyword], join(path, keyword), keyword);
    }
  }

  void check_objects(json& schema, const std::string& path) {
    for (const char* keyword : {"properties", "patternProperties"}) {
      if (schema.contains(keyword)) check_schema_map(schema[keyword], join(path, keyword), keyword);
    }
    for (const char* keyword : {"additionalProperties", "unevaluatedProperties", "propertyNames"}) {
      if (schema.contains(keyword)) check(schema[keyword], join(path, keyword));
    }
    for (const char* keyword : {"minProperties", "maxProperties"}) {
      if (schema.contains(keyword)) check_natural(schema[keyword], join(path, keyword), keyword);
    }
    if (schema.contains("required")) {
      const json& required = schema["required"];
      bool all_strings = required.is_array();
      for (const json& name : required) all_strings = all_strings && name.is_string();
      if (!all_strings) fail(join(path, "required"), "'required' must be a list of property names");
    }
  }
};

void check_json_schema(json& schema, const std::string& prefix) {
  SchemaChecker().check(schema, prefix);
}

json parse_and_check_json_schema(const std::string& text) {
  json schema;
  try {
    schema = json::parse(text);
  } catch (const json::parse_error& e) {
    // e.what() starts with nlohmann's own tag ("[json.exception.parse_error.101] "); the rest says where.
    const std::string reason = e.what();
    fail("", "the schema is not valid JSON: " + reason.substr(reason.find("] ") + 2));
  }
  check_json_schema(schema);
  return schema;
}

void check_structural_tag_schemas(json& tag, const std::string& prefix) {
  if (tag.is_object()) {
    if (tag.value("type", "") == "json_schema" && tag.contains("json_schema")) {
      check_json_schema(tag["json_schema"], join(prefix, "json_schema"));
      return;
    }
    for (auto& [key, value] : tag.items()) check_structural_tag_schemas(value, join(prefix, key));
  } else if (tag.is_array()) {
    for (size_t i = 0; i < tag.size(); ++i) check_structural_tag_schemas(tag[i], join(prefix, std::to_string(i)));
  }
}

}  // namespace tessera::grammar_detail
