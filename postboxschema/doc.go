// Package postboxschema checks message payloads against a JSON Schema per
// topic before they are written, so a malformed event is refused in the
// writer's transaction instead of reaching every consumer.
//
// # Use
//
//	reg, err := postboxschema.Load("schemas", &postboxschema.Options{RequireSchema: true})
//	if err != nil {
//		return err // every bad file, listed at once
//	}
//	client, err := postbox.NewClient(driver, &postbox.Config{Validator: reg})
//
// A payload that violates its topic's schema makes WriteTx and Write return
// a *postbox.ValidationError naming the message and what is wrong, and
// nothing of the batch is written:
//
//	postbox: invalid messages[2].payload: at /amount: must be >= 0 (minimum)
//
// # Files
//
// Load reads one directory (subdirectories are ignored):
//
//   - <topic>.schema.json is the schema of topic, e.g.
//     orders.created.schema.json for "orders.created". The topic part must be
//     a valid topic (postbox.ValidateTopic).
//   - Any other <name>.json is a shared document that topic schemas refer to
//     with "$ref", e.g. {"$ref": "money.json#/$defs/amount"}. It is checked
//     like a schema, and one that no topic schema refers to is an error: a
//     file meant as a topic schema but named orders.created.json would
//     otherwise be ignored without a word.
//   - Files not ending in .json are ignored.
//
// Names use the topic characters (letters, digits and . _ : -). A "$ref"
// resolves against the referring file's name, as it would on disk; write
// "./a:b.json" for a name with a colon, which would otherwise read as a URL
// scheme. Nothing outside the directory is loaded: a "$ref" or "$schema" to
// another URL, a remote one included, is a load error, so loading needs no
// network and its outcome never depends on one.
//
// LoadFS does the same on an fs.FS (an embed.FS, through fs.Sub when the
// files sit in a subdirectory), and New takes schemas held in memory, keyed
// by topic.
//
// # Checking
//
// A topic without a schema passes unchecked unless Options.RequireSchema is
// set. A payload on a topic with a schema must be one JSON document in UTF-8.
// Numbers in it are limited to MaxNumberChars characters and an exponent of
// at most ±MaxNumberExponent: the validator compares numbers exactly, and a
// number past those limits costs seconds of CPU or cannot be compared at all.
//
// The reason of a rejection lists the first violations (Options.MaxViolations,
// default 3) in a fixed order, each with the failing location in the payload
// (a JSON pointer) and the keyword, e.g. `at /items/0: missing property "sku"
// (required)`. An anyOf or oneOf that nothing matched is one violation
// that lists the first failure of each alternative.
//
// Schemas without "$schema" are read as draft 2020-12 unless
// Options.DefaultDraft says otherwise. As that draft specifies, "format" is an
// annotation only, unless Options.AssertFormat is set.
//
// A Registry is immutable once built and safe for concurrent use.
package postboxschema
