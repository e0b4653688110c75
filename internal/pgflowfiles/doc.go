// Package pgflowfiles is upstream pgflow's migration files as the tool
// meets them: the user's own copy (their supabase/migrations, where
// `pgflow install` put them under new names), recognised by content through
// the atlas.sum hashes of each release, and the Supabase ledger row each
// file gets when it is applied, as `supabase db push` writes it.
//
// The files themselves are never part of this repository or the binary:
// only their hash lines are (internal/versions).
package pgflowfiles
