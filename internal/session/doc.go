// Package session is the one place where the tool and its tests open a
// connection to PostgreSQL: it resolves which database a command talks to,
// parses the connection string without ever printing its password, and
// shapes every session for what it is for.
//
// # Purposes
//
// Config, Open, OpenWith and OpenPool take a Purpose:
//
//   - Tool: the tool's own session, as every command opens it (pinned,
//     named "pgflow-upgrade <command>", no named prepared statements, a
//     cancel request on Ctrl-C, per-transaction pin through a pooler that
//     refuses the startup one);
//   - Rehearsal: the tool's SQL on a rehearsal's database (a replayed
//     apply, the wait probe): pinned and named;
//   - Test: what the test harness hands out: pinned like the tool, so test
//     SQL that forgets its schema fails;
//   - Admin: the administrator of a server (databases created and dropped,
//     extensions and fixtures installed, rows generated): the server's own
//     settings;
//   - Application: a stand-in for the application (replay traffic, the
//     0.16.0 worker simulator): the database's own search_path, as the
//     application has it;
//   - Raw: nothing added, for a test that needs the connection as any
//     other client gets it.
//
// # The pin
//
// A pinned session has search_path = SearchPath (pg_catalog, pg_temp) as a
// startup parameter, which beats the connection string's options and any
// ALTER ROLE or ALTER DATABASE setting, and again at the start of every
// transaction, which beats a session-level SET. No schema another role can
// write is ever searched, so no function, operator or type named like a
// built-in runs as the tool's role. Each transaction also gets
// ClientCheckInterval on PostgreSQL 14 and later.
//
// Limits: a statement outside a transaction on a session whose startup pin
// a pooler refused runs with the path of the server session the pooler
// hands out (the tool's SQL names every schema); a pool has no such
// fallback. Limits and Planner set per-transaction settings (SET LOCAL
// semantics) on a session once it is open; Querier is what they and the
// tool's SQL run through.
package session
