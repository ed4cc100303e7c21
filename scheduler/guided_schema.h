// vLLM's guided_json and OpenAI's response_format json_schema: the output is JSON that a JSON
// schema describes. The schema becomes a regular expression over the JSON text (as Outlines
// builds one) and is guided by that expression's automaton (guided_regex.h): properties in the
// schema's order, each required one present, optional ones that may be left out; strings,
// numbers, integers (with bounds), booleans, null, arrays (with item counts), enum and const,
// anyOf/oneOf, $ref into the schema, maps, and any value (nested at most
// kJsonSchemaAnyLevels deep). Between JSON's tokens, a bounded run of whitespace.
//
// A recursive schema (a $ref that reaches its own target again: a tree's children, a linked
// list's next) is more than an expression can say: each recursive definition becomes a rule of
// a GBNF grammar (the expression's parts written as GBNF), called where it recurs, and the
// grammar guides (guided_grammar.h).
//
// What cannot be guided is refused by name, with where it is in the schema (a JSON pointer),
// rather than dropped: allOf of more than one schema, bounds on non-integer numbers other than
// minimum 0, recursion that never ends (a definition that always holds itself again), and every
// keyword not listed in guided_schema.cc.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "scheduler/guided_choice.h"

namespace thetaserve::scheduler {

constexpr int kMaxJsonSchemaBytes = 65536;
constexpr int kMaxJsonSchemaRegexBytes = 1 << 18;  // the expression built from a schema
constexpr int kMaxJsonSchemaWork = 1 << 22;        // its pieces' bytes, all counted
constexpr int kMaxJsonSchemaNesting = 32;          // schemas inside schemas
constexpr int kJsonSchemaWhitespace = 16;          // whitespace bytes in a row between tokens
// Where a schema allows any value (true, {}, no type; an object with neither properties nor
// an additionalProperties schema; an array without items), objects and arrays nested at most
// this deep (the object or array included).
constexpr int kJsonSchemaAnyLevels = 2;
constexpr int kMaxJsonSchemaRecursions = 256;        // recursive definitions
constexpr int kMaxJsonSchemaGrammarBytes = 1 << 19;  // a schema's grammar text

// The regular expression (Python's re syntax, as guided_regex takes) of the JSON texts that
// `schema` (JSON text) describes. INVALID_ARGUMENT "guided_json: <pointer>: <what>" where the
// schema is not JSON, asks for what cannot be guided, or is recursive.
absl::StatusOr<std::string> JsonSchemaRegex(std::string_view schema);

// The GBNF grammar (grammar_syntax.h) of the same texts, recursive schemas included: `root` the
// schema's, `ref<i>-<pointer>` each recursive definition's, `p<n>` their parts'.
absl::StatusOr<std::string> JsonSchemaGrammar(std::string_view schema);

// What the schema's guide would refuse short of building it (an automaton can take 30 ms;
// a tool list's functions are checked each): JsonSchemaRegex's refusals but recursion, and for
// a recursive schema its grammar's (recursion that never ends, past the grammar's bounds).
absl::Status CheckJsonSchema(std::string_view schema);

// The guide for `schema`: JsonSchemaRegex compiled (its automaton's bounds are guided_regex's);
// a recursive schema's JsonSchemaGrammar (a GrammarGuide, its bounds guided_grammar's), and so
// too a schema whose automaton would pass guided_regex's bounds (a string of 800 characters):
// a grammar's cold steps cost more (about 3×), so the automaton is tried first.
absl::StatusOr<std::shared_ptr<const Guide>> CompileJsonSchema(std::string_view schema);

}  // namespace thetaserve::scheduler
