-- pgflow_private_step_queues (20261203100000): pgflow 0.16.0 -> pgflow 0.17.0.
--
-- The end state is exactly upstream pgflow's 0.17.0 schema (its migration
-- 20260915074120_pgflow_private_step_queues): queue identity stored on
-- steps and step_tasks, case-insensitively unique slugs under the stricter
-- slug rule, flows.queue_mode ('flow' | 'step', private per-step queues), the
-- five-argument start_tasks, and every engine function addressing messages
-- by the stored queue name, realtime broadcasts unchanged. Written here from
-- what upstream's change does; nothing of the tool's own lives in schema pgflow.
--
-- Parts (A is this file's frame; `apply --online` does most of B itself in
-- phases - the steps/step_tasks columns, batched backfill, validated checks,
-- is_valid_queue_name, the three unique indexes built concurrently - and
-- runs this file, which then finishes B and runs all of C, as its short
-- switch transaction; see "Online-prepared start" below):
--   A. guard and locks            (refuse anything but 0.16.0; lock in order)
--   B. data definition            (columns nullable -> backfilled -> CHECK +
--                                  NOT NULL, unique indexes)
--   C. function replacement block (new helpers, replaced engine functions,
--                                  the stricter slug rule re-checked, the new
--                                  compile and claim entry points, the
--                                  0.16.0 entry points dropped)
--
-- The replaced functions answer as upstream's 0.17.0 do: the same errors
-- (SQLSTATE, message, DETAIL, HINT) in the same order of validation, the
-- same difference texts, broadcasts and queue effects, also where upstream
-- is arguably wrong (docs/upstream-notes.md). Unlike some of upstream's,
-- every name they use is schema-qualified.
--
-- Run it as one transaction. `pgflow-upgrade apply` does that for you, with
-- the advisory lock, bounded table locks, a preflight under the locks and
-- post-conditions; run by hand, it fails atomically on the same data that
-- makes upstream's migration fail (the preflight explains each case).
-- It reads pgmq only through pgmq's public functions.
--
-- Online-prepared start (`pgflow-upgrade apply --online`, docs/online.md):
-- the file also accepts a 0.16.0 database on which the online path has
-- already added steps.queue_name and step_tasks.queue_name (nullable, every
-- row filled), their validated CHECKs queue_name_is_valid and
-- queue_name_online_check, the three unique indexes (built concurrently,
-- valid), pgflow.is_valid_queue_name and the insert triggers
-- pgflow_upgrade_online_queue_name. Then B3/B4 only SET NOT NULL (proven by
-- the validated check, no scan) and drop the temporary check and trigger;
-- the resulting catalog is the same as from plain 0.16.0. The guard (A1)
-- refuses any other shape that has those columns.

-- ---------------------------------------------------------------------------
-- A1. Guard: the pgflow 0.16.0 shape, or refuse with a reason.
-- ---------------------------------------------------------------------------
do $guard$
declare
  v_missing text;
begin
  select pg_catalog.string_agg(t, ', ') into v_missing
  from pg_catalog.unnest(array['flows', 'steps', 'deps', 'runs', 'step_states', 'step_tasks', 'workers']) t
  where pg_catalog.to_regclass('pgflow.' || t) is null;
  if v_missing is not null then
    raise exception 'pgflow_private_step_queues: pgflow tables missing: %', v_missing
      using hint = 'This migration upgrades a pgflow 0.16.0 database.';
  end if;
  if exists (select 1 from pg_catalog.pg_attribute a
             where a.attrelid = 'pgflow.flows'::pg_catalog.regclass
               and a.attname in ('queue_mode', 'queue_name') and not a.attisdropped) then
    raise exception 'pgflow_private_step_queues: pgflow.flows already has queue_mode or queue_name: not a 0.16.0 database'
      using hint = 'Run `pgflow-upgrade status`: a 0.17.0 database needs nothing, anything else needs a look.';
  end if;
  if pg_catalog.to_regprocedure('pgflow.start_tasks(text, bigint[], uuid)') is null
     or pg_catalog.to_regprocedure('pgflow.ensure_flow_compiled(text, jsonb)') is null
     or pg_catalog.to_regprocedure('pgflow._create_flow_from_shape(text, jsonb)') is null then
    raise exception 'pgflow_private_step_queues: the 0.16.0 functions start_tasks(text, bigint[], uuid), ensure_flow_compiled(text, jsonb) and _create_flow_from_shape(text, jsonb) are not all present'
      using hint = 'This migration starts from pgflow 0.16.0 exactly.';
  end if;
end
$guard$;

-- A1b. Guard, online-prepared start: either none of the online path's objects
--      (plain 0.16.0), or all of them exactly as `apply --online` prepares them.
--      Definitions are printed with search_path pg_catalog (fully qualified),
--      then the caller's search_path is restored.
do $guard_online$
declare
  v_path text := pg_catalog.current_setting('search_path');
  v_cols integer;
  v_bad text[] := '{}';
  v_want record;
begin
  perform pg_catalog.set_config('search_path', 'pg_catalog', true);
  select pg_catalog.count(*)::integer into v_cols
    from pg_catalog.pg_attribute a
   where a.attrelid in ('pgflow.steps'::pg_catalog.regclass, 'pgflow.step_tasks'::pg_catalog.regclass)
     and a.attname = 'queue_name' and not a.attisdropped;
  if v_cols = 0 then
    select pg_catalog.array_agg(c.relname::text) into v_bad
      from pg_catalog.pg_class c
     where c.relnamespace = 'pgflow'::pg_catalog.regnamespace
       and c.relname in ('idx_flows_normalized_slug', 'idx_steps_normalized_slug', 'idx_step_tasks_queue_message');
    if v_bad is not null then
      raise exception 'pgflow_private_step_queues: pgflow already has %, but not the queue_name columns: not a 0.16.0 database', v_bad
        using hint = 'Run `pgflow-upgrade status`; an unfinished `apply --online` is finished by running it again or undone by `apply --rollback-online`.';
    end if;
  else
    for v_want in
      select * from (values
        ('column', 'steps', 'queue_name', 'text null'),
        ('column', 'step_tasks', 'queue_name', 'text null'),
        ('check', 'steps', 'queue_name_is_valid', 'CHECK (pgflow.is_valid_queue_name(queue_name))'),
        ('check', 'step_tasks', 'queue_name_is_valid', 'CHECK (pgflow.is_valid_queue_name(queue_name))'),
        ('check', 'steps', 'queue_name_online_check', 'CHECK (((queue_name IS NOT NULL) AND (queue_name = lower(flow_slug))))'),
        ('check', 'step_tasks', 'queue_name_online_check', 'CHECK (((queue_name IS NOT NULL) AND (queue_name = lower(flow_slug))))'),
        ('index', 'flows', 'idx_flows_normalized_slug', 'CREATE UNIQUE INDEX idx_flows_normalized_slug ON pgflow.flows USING btree (lower(flow_slug))'),
        ('index', 'steps', 'idx_steps_normalized_slug', 'CREATE UNIQUE INDEX idx_steps_normalized_slug ON pgflow.steps USING btree (flow_slug, lower(step_slug))'),
        ('index', 'step_tasks', 'idx_step_tasks_queue_message', 'CREATE UNIQUE INDEX idx_step_tasks_queue_message ON pgflow.step_tasks USING btree (queue_name, message_id) WHERE (message_id IS NOT NULL)')
      ) w(kind, tbl, name, def)
    loop
      if not exists (
        select 1 from pg_catalog.pg_attribute a
         where v_want.kind = 'column' and a.attrelid = ('pgflow.' || v_want.tbl)::pg_catalog.regclass
           and a.attname = v_want.name and not a.attisdropped and not a.attnotnull
           and a.atttypid = 'pg_catalog.text'::pg_catalog.regtype
        union all
        select 1 from pg_catalog.pg_constraint c
         where v_want.kind = 'check' and c.conrelid = ('pgflow.' || v_want.tbl)::pg_catalog.regclass
           and c.conname = v_want.name and c.contype = 'c' and c.convalidated
           and pg_catalog.pg_get_constraintdef(c.oid) = v_want.def
        union all
        select 1 from pg_catalog.pg_index i
         where v_want.kind = 'index' and i.indrelid = ('pgflow.' || v_want.tbl)::pg_catalog.regclass
           and i.indexrelid = pg_catalog.to_regclass('pgflow.' || v_want.name)
           and i.indisvalid and i.indisready
           and pg_catalog.pg_get_indexdef(i.indexrelid) = v_want.def)
      then
        v_bad := v_bad || (v_want.kind || ' pgflow.' || v_want.tbl || ' ' || v_want.name);
      end if;
    end loop;
    if pg_catalog.cardinality(v_bad) > 0 then
      raise exception 'pgflow_private_step_queues: pgflow has queue_name columns but is not the online-prepared 0.16.0; missing or different: %', pg_catalog.array_to_string(v_bad, ', ')
        using hint = 'Run `pgflow-upgrade apply --online` again to finish preparing (or `apply --rollback-online` to undo it).';
    end if;
  end if;
  perform pg_catalog.set_config('search_path', v_path, true);
end
$guard_online$;

-- ---------------------------------------------------------------------------
-- A2. Locks, in the documented order (docs/design.md "Lock order"):
--     flows, steps, deps, runs, step_states, step_tasks, workers. The altered
--     tables need ACCESS EXCLUSIVE anyway; the others only need writers
--     stopped. `apply` holds exactly these already (each try bounded by
--     lock_timeout, retried with backoff), so here they are granted at once.
--     Run by hand with no lock_timeout, waits are bounded to 10 s.
-- ---------------------------------------------------------------------------
select pg_catalog.set_config('lock_timeout', '10s', true)
 where pg_catalog.current_setting('lock_timeout') in ('0', '0ms');
lock table pgflow.flows in access exclusive mode;
lock table pgflow.steps in access exclusive mode;
lock table pgflow.deps, pgflow.runs, pgflow.step_states in exclusive mode;
lock table pgflow.step_tasks in access exclusive mode;
lock table pgflow.workers in exclusive mode;

-- ---------------------------------------------------------------------------
-- B1. flows.queue_mode: a constant default, so adding it writes no row.
--     Case-only flow aliases would share one pgmq queue: refused by the index.
-- ---------------------------------------------------------------------------
alter table pgflow.flows
  add column queue_mode text not null default 'flow'
  constraint queue_mode_is_valid check (queue_mode in ('flow', 'step'));

create unique index if not exists idx_flows_normalized_slug on pgflow.flows (pg_catalog.lower(flow_slug));

-- B2. The queue-name rule the CHECKs below use (pgmq's 47-character limit,
--     already lowercase, as pgmq names its tables).
create or replace function pgflow.is_valid_queue_name(queue_name text)
returns boolean
language sql
immutable
set search_path = ''
as $$
  select queue_name is not null
     and queue_name <> ''
     and pg_catalog.length(queue_name) <= 47
     and queue_name = pg_catalog.lower(queue_name)
$$;

-- ---------------------------------------------------------------------------
-- B3. step_tasks.queue_name. The plain message_id index goes first (the
--     unique (queue_name, message_id) index replaces it, and it would
--     otherwise be rebuilt by the rewrite).
--     Added nullable, then filled by one table rewrite: ALTER COLUMN .. TYPE
--     .. USING writes every row once with lower(flow_slug), and the CHECK and
--     NOT NULL given in the same ALTER are checked during that pass, so there
--     is no UPDATE (a new version of every row and index entry) and no second
--     scan. The end state is that of add nullable / update / check / not null.
-- ---------------------------------------------------------------------------
drop index pgflow.idx_step_tasks_message_id;

--     Online-prepared (A1b): the rows are filled and the validated
--     queue_name_online_check (queue_name IS NOT NULL AND = lower(flow_slug))
--     proves NOT NULL, so SET NOT NULL reads no row.
do $b3$
begin
  if exists (select 1 from pg_catalog.pg_attribute a
             where a.attrelid = 'pgflow.step_tasks'::pg_catalog.regclass
               and a.attname = 'queue_name' and not a.attisdropped) then
    alter table pgflow.step_tasks alter column queue_name set not null;
    alter table pgflow.step_tasks drop constraint queue_name_online_check;
    drop trigger if exists pgflow_upgrade_online_queue_name on pgflow.step_tasks;
  else
    alter table pgflow.step_tasks add column queue_name text;
    alter table pgflow.step_tasks
      alter column queue_name type text using pg_catalog.lower(flow_slug),
      add constraint queue_name_is_valid check (pgflow.is_valid_queue_name(queue_name)),
      alter column queue_name set not null;
  end if;
end
$b3$;

-- The durable address of a message. Two tasks of one queue sharing a message
-- id make this build fail (23505); `apply` then names them.
create unique index if not exists idx_step_tasks_queue_message
  on pgflow.step_tasks (queue_name, message_id)
  where message_id is not null;

-- B4. steps.queue_name: a small table, so the plain three stages.
--     Online-prepared: as in B3.
do $b4$
begin
  if exists (select 1 from pg_catalog.pg_attribute a
             where a.attrelid = 'pgflow.steps'::pg_catalog.regclass
               and a.attname = 'queue_name' and not a.attisdropped) then
    alter table pgflow.steps alter column queue_name set not null;
    alter table pgflow.steps drop constraint queue_name_online_check;
    drop trigger if exists pgflow_upgrade_online_queue_name on pgflow.steps;
  else
    alter table pgflow.steps add column queue_name text;
    update pgflow.steps s set queue_name = pg_catalog.lower(s.flow_slug) where s.queue_name is null;
    alter table pgflow.steps add constraint queue_name_is_valid check (pgflow.is_valid_queue_name(queue_name));
    alter table pgflow.steps alter column queue_name set not null;
  end if;
end
$b4$;

create unique index if not exists idx_steps_normalized_slug on pgflow.steps (flow_slug, pg_catalog.lower(step_slug));

-- ===========================================================================
-- C. Function replacement block. Every message operation below uses the
--    queue stored on the task (or step), never one rebuilt from a slug, and
--    archives are grouped per queue.
-- ===========================================================================

-- C1. Queue-name helpers.

-- The spelling pgmq lists for a queue, matched case-insensitively (pgmq keeps
-- the name as created but names its tables in lowercase). A name pgmq does
-- not list is returned as given (pgmq then answers for it); more than one
-- listed spelling is ambiguous.
create function pgflow._listed_queue_name(p_queue_name text)
returns text
language plpgsql
stable
set search_path = ''
as $$
declare
  v_names text[];
begin
  -- The spellings are listed in the database's default collation order.
  select pg_catalog.array_agg(q.queue_name::text order by q.queue_name::text)
    into v_names
    from pgmq.list_queues() q
   where pg_catalog.lower(q.queue_name::text) = pg_catalog.lower(p_queue_name);
  if v_names is null then
    return p_queue_name;
  end if;
  if pg_catalog.cardinality(v_names) > 1 then
    raise exception 'queue name "%" is ambiguous: it matches listed queues %', p_queue_name, v_names
      using errcode = 'ambiguous_alias';
  end if;
  return v_names[1];
end
$$;

-- The private queue of one step: lower(flow__step) when it fits pgmq's 47
-- characters, else lower(flow__<index>); never truncated or hashed.
create function pgflow._resolve_step_queue_name(p_flow_slug text, p_step_slug text, p_step_index integer)
returns text
language plpgsql
immutable
set search_path = ''
as $$
declare
  v_readable text := pg_catalog.lower(p_flow_slug || '__' || p_step_slug);
  v_shortest text := pg_catalog.lower(p_flow_slug || '__0');
  v_fallback text := pg_catalog.lower(p_flow_slug || '__' || p_step_index::text);
begin
  if pg_catalog.length(v_readable) <= 47 then
    return v_readable;
  end if;
  if pg_catalog.length(v_shortest) > 47 then
    raise exception 'Flow "%" cannot use per-step queues.', p_flow_slug
      using detail = pg_catalog.format('The shortest required queue "%s" is %s characters; PGMQ allows at most 47.',
                                       v_shortest, pg_catalog.length(v_shortest)),
            hint = 'Shorten the concrete flow slug or use the default single queue.';
  end if;
  if pg_catalog.length(v_fallback) > 47 then
    raise exception 'Cannot derive a queue for step "%" at index % in flow "%".', p_step_slug, p_step_index, p_flow_slug
      using detail = pg_catalog.format('The readable name is %s characters and the index fallback is %s; PGMQ allows at most 47.',
                                       pg_catalog.length(v_readable), pg_catalog.length(v_fallback)),
            hint = 'Shorten the concrete flow slug, shorten the step slug enough for the readable name, or use the default single queue.';
  end if;
  return v_fallback;
end
$$;

-- The ordered route list of a flow definition: [{stepSlug, queueName}] in
-- shape order, after checking mode, slugs, case-insensitive step uniqueness
-- and (step mode) the queue names.
create function pgflow._derive_queue_routes(p_flow_slug text, p_shape jsonb, p_queue_mode text)
returns jsonb
language plpgsql
set search_path = ''
as $$
declare
  v_slug_rule constant text := 'Slugs are 1-128 characters of letters, digits, and single underscores, must start with a letter, cannot end with an underscore, cannot contain ''__'', and cannot be the reserved word ''run''.';
  v_mode text := coalesce(p_queue_mode, 'flow');
  v_steps jsonb := p_shape -> 'steps';
  v_slugs text[] := '{}';
  v_names text[] := '{}';
  v_slug text;
  v_name text;
  v_index integer;
  v_earlier integer;
  v_routes jsonb := '[]'::jsonb;
begin
  -- The checks run in a fixed order, so that a definition with several
  -- faults always reports the same one first: the mode, an empty step-mode
  -- flow, the flow slug, every step slug, then step by step the
  -- case-insensitive collisions and the queue names. A NULL mode is the
  -- default flow mode.
  if p_queue_mode is not null and p_queue_mode not in ('flow', 'step') then
    raise exception 'Unknown queue mode "%".', p_queue_mode
      using hint = 'Queue mode must be ''flow'' or ''step''.';
  end if;
  -- A steps value that is not an array fails here in step mode (PostgreSQL's
  -- own 22023), and when its elements are read in flow mode.
  if v_mode = 'step' and coalesce(pg_catalog.jsonb_array_length(v_steps), 0) = 0 then
    raise exception 'Flow "%" cannot use per-step queues: it has no steps.', p_flow_slug
      using detail = 'Per-step queue mode requires at least one step.',
            hint = 'Add a step or keep the flow on the default single queue.';
  end if;
  if not coalesce(pgflow.is_valid_slug(p_flow_slug), false) then
    raise exception 'Flow slug "%" is not valid.', p_flow_slug
      using detail = v_slug_rule,
            hint = 'Fix the flow slug in the flow definition.';
  end if;

  select coalesce(pg_catalog.array_agg(e.value ->> 'slug' order by e.ord), '{}')
    into v_slugs
    from pg_catalog.jsonb_array_elements(v_steps) with ordinality as e(value, ord);
  foreach v_slug in array v_slugs loop
    if not coalesce(pgflow.is_valid_slug(v_slug), false) then
      raise exception 'Step slug "%" in flow "%" is not valid.', v_slug, p_flow_slug
        using detail = v_slug_rule,
              hint = 'Fix the step slug in the flow definition.';
    end if;
  end loop;

  for v_index in 0 .. pg_catalog.cardinality(v_slugs) - 1 loop
    v_slug := v_slugs[v_index + 1];
    for v_earlier in 1 .. v_index loop
      if pg_catalog.lower(v_slugs[v_earlier]) = pg_catalog.lower(v_slug) then
        raise exception 'Steps "%" and "%" in flow "%" conflict case-insensitively.', v_slugs[v_earlier], v_slug, p_flow_slug
          using detail = 'Step slugs must be unique case-insensitively.',
                hint = 'Rename one of the colliding steps.';
      end if;
    end loop;
    if v_mode = 'step' then
      v_name := pgflow._resolve_step_queue_name(p_flow_slug, v_slug, v_index);
      perform pgmq.validate_queue_name(v_name);
      v_earlier := pg_catalog.array_position(v_names, v_name);
      if v_earlier is not null then
        raise exception 'Steps "%" and "%" in flow "%" both resolve to queue "%".', v_slugs[v_earlier], v_slug, p_flow_slug, v_name
          using detail = 'Generated queue names must be unique per flow.',
                hint = 'Step slugs must be unique case-insensitively; rename one of the colliding steps.';
      end if;
    else
      v_name := pg_catalog.lower(p_flow_slug);
    end if;
    v_names := v_names || v_name;
    v_routes := v_routes || pg_catalog.jsonb_build_array(
      pg_catalog.jsonb_build_object('stepSlug', v_slug, 'queueName', v_name));
  end loop;
  return v_routes;
end
$$;

-- ---------------------------------------------------------------------------
-- C2. Engine functions replaced (same signatures), queue-aware.
-- ---------------------------------------------------------------------------

-- The task's message, archived in the task's own queue.
create or replace function pgflow._archive_task_message(p_run_id uuid, p_step_slug text, p_task_index integer)
returns void
language sql
set search_path = ''
as $$
  select pgmq.archive(t.queue_name, t.message_id)
    from pgflow.step_tasks t
   where t.run_id = p_run_id
     and t.step_slug = p_step_slug
     and t.task_index = p_task_index
     and t.message_id is not null;
$$;

-- Starts every ready step of a run: broadcasts step:<slug>:started, sends one
-- message per task to the step's queue, and records each task with that queue.
create or replace function pgflow.start_ready_steps(run_id uuid)
returns void
language plpgsql
set search_path = ''
as $$
declare
  v_status text;
  v_step record;
  v_started pgflow.step_states;
  v_slugs text[] := '{}';
  v_flows text[] := '{}';
  v_queues text[] := '{}';
  v_delays integer[] := '{}';
  v_counts integer[] := '{}';
  v_i integer;
  v_ids bigint[];
begin
  select r.status into v_status from pgflow.runs r where r.run_id = start_ready_steps.run_id;
  if v_status in ('completed', 'failed') then
    return;
  end if;

  -- The ready steps, locked and started in slug order (usually none: then
  -- this indexed read is the whole call). Every step:<slug>:started is
  -- broadcast before any message is sent, as pgflow 0.17.0 orders them.
  for v_step in
    select ss.flow_slug, ss.step_slug, s.queue_name, coalesce(s.opt_start_delay, 0) as start_delay
      from pgflow.step_states ss
      join pgflow.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
     where ss.run_id = start_ready_steps.run_id
       and ss.status = 'created'
       and ss.remaining_deps = 0
       and ss.initial_tasks > 0
     order by ss.step_slug
       for update of ss
  loop
    update pgflow.step_states ss
       set status = 'started',
           started_at = pg_catalog.now(),
           remaining_tasks = ss.initial_tasks
     where ss.run_id = start_ready_steps.run_id and ss.step_slug = v_step.step_slug
    returning * into v_started;

    perform realtime.send(
      pg_catalog.jsonb_build_object(
        'event_type', 'step:started',
        'run_id', v_started.run_id,
        'step_slug', v_started.step_slug,
        'status', v_started.status,
        'started_at', v_started.started_at,
        'remaining_tasks', v_started.remaining_tasks,
        'remaining_deps', v_started.remaining_deps),
      'step:' || v_started.step_slug || ':started',
      'pgflow:run:' || v_started.run_id,
      false);

    v_slugs := v_slugs || v_step.step_slug;
    v_flows := v_flows || v_step.flow_slug;
    v_queues := v_queues || v_step.queue_name;
    v_delays := v_delays || v_step.start_delay;
    v_counts := v_counts || v_started.initial_tasks;
  end loop;

  -- Then one batch per started step, in the same slug order, to the step's
  -- queue; each task is recorded with that queue and its message.
  for v_i in 1 .. pg_catalog.cardinality(v_slugs) loop
    select pg_catalog.array_agg(m.id order by m.ord) into v_ids
      from pgmq.send_batch(
             v_queues[v_i],
             array(select pg_catalog.jsonb_build_object(
                            'flow_slug', v_flows[v_i],
                            'run_id', start_ready_steps.run_id,
                            'step_slug', v_slugs[v_i],
                            'task_index', i)
                     from pg_catalog.generate_series(0, v_counts[v_i] - 1) i
                    order by i),
             v_delays[v_i]) with ordinality as m(id, ord);

    insert into pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, message_id, queue_name)
    select v_flows[v_i], start_ready_steps.run_id, v_slugs[v_i], (m.ord - 1)::integer, m.id, v_queues[v_i]
      from pg_catalog.unnest(v_ids) with ordinality as m(id, ord);
  end loop;
end
$$;

-- Skips a step and every transitive dependent still created or started,
-- and their active tasks; archives those tasks' messages (see below for
-- which queues).
create or replace function pgflow._cascade_force_skip_steps(run_id uuid, step_slug text, skip_reason text)
returns integer
language plpgsql
as $$
declare
  v_flow_slug text;
  v_count integer := 0;
  v_skipped record;
  v_group record;
  v_archived integer;
  v_slugs text[] := '{}';
begin
  select r.flow_slug into v_flow_slug
    from pgflow.runs r where r.run_id = _cascade_force_skip_steps.run_id;
  if v_flow_slug is null then
    raise exception 'Run not found: %', _cascade_force_skip_steps.run_id;
  end if;

  -- The step and every transitive dependent still created or started are
  -- skipped in one statement; the trigger keeps the given reason, the
  -- dependents get dependency_skipped.
  --
  -- Broadcast order: dependency order (step_index: a step is added after
  -- every step it depends on), so the trigger comes before its dependents
  -- on every plan. pgflow 0.17.0 sends from inside its UPDATE, in the order
  -- the executor visits the rows (ascending step_slug on tiny tables, the
  -- rows' physical order on populated ones), which its own test of this
  -- order does not always meet. The targets are read and locked before the
  -- update, and the events follow their step_index.
  for v_skipped in
    with recursive tree(step_slug) as (
      select _cascade_force_skip_steps.step_slug
      union
      select d.step_slug
        from pgflow.deps d
        join tree on d.dep_slug = tree.step_slug
       where d.flow_slug = v_flow_slug
    ), targets as materialized (
      select st.step_index as position, ss.step_slug
        from pgflow.step_states ss
        join pgflow.steps st on st.flow_slug = v_flow_slug and st.step_slug = ss.step_slug
       where ss.run_id = _cascade_force_skip_steps.run_id
         and ss.step_slug in (select tree.step_slug from tree)
         and ss.status in ('created', 'started')
         for update of ss
    ), skipped as (
      update pgflow.step_states ss
         set status = 'skipped',
             skip_reason = case when ss.step_slug = _cascade_force_skip_steps.step_slug
                                then _cascade_force_skip_steps.skip_reason
                                else 'dependency_skipped' end,
             skipped_at = pg_catalog.now(),
             remaining_tasks = null
        from targets x
       where ss.run_id = _cascade_force_skip_steps.run_id
         and ss.step_slug = x.step_slug
      returning ss.step_slug, ss.skip_reason, ss.skipped_at
    )
    select k.step_slug, k.skip_reason, k.skipped_at
      from skipped k
      join targets x on x.step_slug = k.step_slug
     order by x.position
  loop
    v_count := v_count + 1;
    v_slugs := v_slugs || v_skipped.step_slug;
    perform realtime.send(
      pg_catalog.jsonb_build_object(
        'event_type', 'step:skipped',
        'run_id', _cascade_force_skip_steps.run_id,
        'flow_slug', v_flow_slug,
        'step_slug', v_skipped.step_slug,
        'status', 'skipped',
        'skip_reason', v_skipped.skip_reason,
        'skipped_at', v_skipped.skipped_at),
      'step:' || v_skipped.step_slug || ':skipped',
      'pgflow:run:' || _cascade_force_skip_steps.run_id,
      false);
  end loop;

  -- The skipped steps' active tasks are all skipped. Their messages are
  -- archived per queue as pgflow 0.17.0 does it: queue by queue only until
  -- one archive call archives a message; the messages of the remaining
  -- queues stay live (0.17.1 archives every queue). Flow mode has one
  -- queue and is not affected. Which queue comes first follows
  -- upstream's aggregate output, which no ORDER BY fixes; name order here.
  if v_count = 0 then
    return 0;
  end if;
  for v_group in
    with done as (
      update pgflow.step_tasks t
         set status = 'skipped'
       where t.run_id = _cascade_force_skip_steps.run_id
         and t.step_slug = any (v_slugs)
         and t.status in ('queued', 'started')
      returning t.queue_name, t.message_id
    )
    select done.queue_name, pg_catalog.array_agg(done.message_id order by done.message_id) as ids
      from done
     where done.message_id is not null
     group by done.queue_name
     order by done.queue_name
  loop
    select pg_catalog.count(*)::integer into v_archived from pgmq.archive(v_group.queue_name, v_group.ids);
    exit when v_archived > 0;
  end loop;

  update pgflow.runs r
     set remaining_steps = r.remaining_steps - v_count
   where r.run_id = _cascade_force_skip_steps.run_id;

  return v_count;
end
$$;

-- Decides the conditions of every created step whose dependencies are done:
-- an unmet 'fail' step fails the run (false); unmet 'skip' steps are skipped;
-- unmet 'skip-cascade' steps are skipped with their dependents. Repeats while
-- plain skips make new steps ready (at most 50 iterations).
create or replace function pgflow.cascade_resolve_conditions(run_id uuid)
returns boolean
language plpgsql
set search_path = ''
as $$
declare
  v_status text;
  v_input jsonb;
  v_flow_slug text;
  v_round integer := 0;
  v_fail_slug text;
  v_skip_slugs text[];
  v_skip record;
  v_slug text;
  v_now timestamptz;
  v_group record;
begin
  -- A finished run: true when completed, false when failed. A run that
  -- does not exist is not an error here: nothing is found, true.
  select r.status, r.input, r.flow_slug into v_status, v_input, v_flow_slug
    from pgflow.runs r where r.run_id = cascade_resolve_conditions.run_id;
  if v_status in ('failed', 'completed') then
    return v_status <> 'failed';
  end if;

  -- Each iteration: the first unmet 'fail' step fails the run; else every
  -- unmet 'skip' step is skipped (its dependents lose a dependency); then,
  -- seeing those skips, every unmet 'skip-cascade' step is skipped with its
  -- dependents. Another iteration follows only when plain skips happened
  -- (they can make new steps ready). A step's condition input: the run
  -- input for a root step, else the completed dependencies' outputs keyed
  -- by slug (skipped ones absent).
  loop
    v_round := v_round + 1;
    if v_round > 50 then
      raise exception 'cascade_resolve_conditions exceeded safety limit of % iterations', 50;
    end if;

    -- 1. The first unmet 'fail' step (in step order) fails the run, if the
    --    run is still started; false either way.
    select s.step_slug
      from pgflow.step_states ss
      join pgflow.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
      cross join lateral (
        select case when s.deps_count = 0 then v_input
                    else coalesce((select pg_catalog.jsonb_object_agg(d.dep_slug, ds.output)
                                     from pgflow.deps d
                                     join pgflow.step_states ds
                                       on ds.run_id = ss.run_id and ds.step_slug = d.dep_slug and ds.status = 'completed'
                                    where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug), '{}'::jsonb)
               end as input) c
     where ss.run_id = cascade_resolve_conditions.run_id
       and ss.status = 'created'
       and ss.remaining_deps = 0
       and s.when_unmet = 'fail'
       and (s.required_input_pattern is not null or s.forbidden_input_pattern is not null)
       and not ((s.required_input_pattern is null or c.input @> s.required_input_pattern)
                and (s.forbidden_input_pattern is null or not (c.input @> s.forbidden_input_pattern)))
     order by s.step_index
     limit 1
      into v_fail_slug;
    if found then
      v_now := pg_catalog.now();
      update pgflow.runs r
         set status = 'failed', failed_at = v_now
       where r.run_id = cascade_resolve_conditions.run_id and r.status = 'started';
      if found then
        update pgflow.step_states ss
           set status = 'failed', error_message = 'Condition not met', failed_at = v_now
         where ss.run_id = cascade_resolve_conditions.run_id and ss.step_slug = v_fail_slug;
        perform realtime.send(
          pg_catalog.jsonb_build_object(
            'event_type', 'step:failed',
            'run_id', cascade_resolve_conditions.run_id,
            'step_slug', v_fail_slug,
            'status', 'failed',
            'error_message', 'Condition not met',
            'failed_at', v_now),
          'step:' || v_fail_slug || ':failed',
          'pgflow:run:' || cascade_resolve_conditions.run_id,
          false);
        perform realtime.send(
          pg_catalog.jsonb_build_object(
            'event_type', 'run:failed',
            'run_id', cascade_resolve_conditions.run_id,
            'flow_slug', v_flow_slug,
            'status', 'failed',
            'error_message', 'Condition not met',
            'failed_at', v_now),
          'run:failed',
          'pgflow:run:' || cascade_resolve_conditions.run_id,
          false);
        -- Active tasks are cancelled first, then their messages archived per queue.
        for v_group in
          with cancelled as (
            update pgflow.step_tasks t
               set status = 'cancelled'
             where t.run_id = cascade_resolve_conditions.run_id
               and t.status in ('queued', 'started')
            returning t.queue_name, t.message_id
          )
          select c.queue_name, pg_catalog.array_agg(c.message_id order by c.message_id) as ids
            from cancelled c
           where c.message_id is not null
           group by c.queue_name
           order by c.queue_name
        loop
          perform pgmq.archive(v_group.queue_name, v_group.ids);
        end loop;
      end if;
      return false;
    end if;

    -- 2. Every unmet 'skip' step at once. pgflow 0.17.0 broadcasts from
    --    inside one UPDATE, in the order the executor visits the rows (plan
    --    dependent); the cases observed follow step order, as here.
    v_skip_slugs := array(select s.step_slug
                            from pgflow.step_states ss
                            join pgflow.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
                            cross join lateral (
                              select case when s.deps_count = 0 then v_input
                                          else coalesce((select pg_catalog.jsonb_object_agg(d.dep_slug, ds.output)
                                                           from pgflow.deps d
                                                           join pgflow.step_states ds
                                                             on ds.run_id = ss.run_id and ds.step_slug = d.dep_slug and ds.status = 'completed'
                                                          where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug), '{}'::jsonb)
                                     end as input) c
                           where ss.run_id = cascade_resolve_conditions.run_id
                             and ss.status = 'created'
                             and ss.remaining_deps = 0
                             and s.when_unmet = 'skip'
                             and (s.required_input_pattern is not null or s.forbidden_input_pattern is not null)
                             and not ((s.required_input_pattern is null or c.input @> s.required_input_pattern)
                                      and (s.forbidden_input_pattern is null or not (c.input @> s.forbidden_input_pattern)))
                           order by s.step_index);
    if pg_catalog.cardinality(v_skip_slugs) > 0 then
      for v_skip in
        with skipped as (
          update pgflow.step_states ss
             set status = 'skipped', skip_reason = 'condition_unmet', skipped_at = pg_catalog.now()
           where ss.run_id = cascade_resolve_conditions.run_id
             and ss.step_slug = any (v_skip_slugs)
             and ss.status = 'created'
          returning ss.step_slug, ss.skipped_at
        )
        select k.step_slug, k.skipped_at
          from skipped k
         order by pg_catalog.array_position(v_skip_slugs, k.step_slug)
      loop
        perform realtime.send(
          pg_catalog.jsonb_build_object(
            'event_type', 'step:skipped',
            'run_id', cascade_resolve_conditions.run_id,
            'flow_slug', v_flow_slug,
            'step_slug', v_skip.step_slug,
            'status', 'skipped',
            'skip_reason', 'condition_unmet',
            'skipped_at', v_skip.skipped_at),
          'step:' || v_skip.step_slug || ':skipped',
          'pgflow:run:' || cascade_resolve_conditions.run_id,
          false);
      end loop;

      -- Each dependent loses one dependency per skipped parent; a map whose
      -- only parent was skipped has no tasks.
      update pgflow.step_states child
         set remaining_deps = child.remaining_deps - x.n,
             initial_tasks = case when cs.step_type = 'map' and cs.deps_count = 1 then 0
                                  else child.initial_tasks end
        from (select d.step_slug, pg_catalog.count(*)::integer as n
                from pgflow.deps d
               where d.flow_slug = v_flow_slug
                 and d.dep_slug = any (v_skip_slugs)
               group by d.step_slug) x,
             pgflow.steps cs
       where child.run_id = cascade_resolve_conditions.run_id
         and child.step_slug = x.step_slug
         and cs.flow_slug = v_flow_slug and cs.step_slug = x.step_slug;

      update pgflow.runs r
         set remaining_steps = r.remaining_steps - pg_catalog.cardinality(v_skip_slugs)
       where r.run_id = cascade_resolve_conditions.run_id;
    end if;

    -- 3. Unmet 'skip-cascade' steps, found after this iteration's plain
    --    skips (a step they made ready is handled now), in step order.
    for v_slug in
      select s.step_slug
        from pgflow.step_states ss
        join pgflow.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
        cross join lateral (
          select case when s.deps_count = 0 then v_input
                      else coalesce((select pg_catalog.jsonb_object_agg(d.dep_slug, ds.output)
                                       from pgflow.deps d
                                       join pgflow.step_states ds
                                         on ds.run_id = ss.run_id and ds.step_slug = d.dep_slug and ds.status = 'completed'
                                      where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug), '{}'::jsonb)
                 end as input) c
       where ss.run_id = cascade_resolve_conditions.run_id
         and ss.status = 'created'
         and ss.remaining_deps = 0
         and s.when_unmet = 'skip-cascade'
         and (s.required_input_pattern is not null or s.forbidden_input_pattern is not null)
         and not ((s.required_input_pattern is null or c.input @> s.required_input_pattern)
                  and (s.forbidden_input_pattern is null or not (c.input @> s.forbidden_input_pattern)))
       order by s.step_index
    loop
      perform pgflow._cascade_force_skip_steps(cascade_resolve_conditions.run_id, v_slug, 'condition_unmet');
    end loop;

    select r.status into v_status from pgflow.runs r where r.run_id = cascade_resolve_conditions.run_id;
    if v_status in ('failed', 'completed') then
      return v_status <> 'failed';
    end if;

    exit when pg_catalog.cardinality(v_skip_slugs) = 0;
  end loop;
  return true;
end
$$;

-- A worker's success report. Returns the task row in every case.
create or replace function pgflow.complete_task(run_id uuid, step_slug text, task_index integer, output jsonb)
returns setof pgflow.step_tasks
language plpgsql
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_state pgflow.step_states;
  v_step pgflow.steps;
  v_map_child text;
  v_type text;
  v_now timestamptz;
  v_group record;
  v_completed pgflow.step_states;
begin
  -- A run that failed earlier: nothing to do.
  if exists (select 1 from pgflow.runs r
              where r.run_id = complete_task.run_id and r.status = 'failed') then
    return query select * from pgflow.step_tasks t
      where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
        and t.task_index = complete_task.task_index;
    return;
  end if;

  -- Run first, then the step: the order every writer of a run follows.
  select * into v_run from pgflow.runs r where r.run_id = complete_task.run_id for update;
  select * into v_state from pgflow.step_states ss
   where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug for update;

  -- Failed meanwhile, or a late report for a step no longer started: the
  -- message goes, nothing else changes. A step with no state row at all
  -- does not take this exit: the report falls through, changes nothing, and
  -- the run's ready steps and completion are still looked at (as pgflow
  -- 0.17.0 does).
  if v_run.status = 'failed' or v_state.status <> 'started' then
    perform pgflow._archive_task_message(complete_task.run_id, complete_task.step_slug, complete_task.task_index);
    return query select * from pgflow.step_tasks t
      where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
        and t.task_index = complete_task.task_index;
    return;
  end if;

  select * into v_step from pgflow.steps s
   where s.flow_slug = v_run.flow_slug and s.step_slug = complete_task.step_slug;

  -- A single step feeding a map whose task count is still unknown must
  -- produce an array. With several such maps, which one the error names is
  -- not defined (pgflow 0.17.0 takes any one).
  if v_step.step_type = 'single' and pg_catalog.jsonb_typeof(complete_task.output) is distinct from 'array' then
    select d.step_slug into v_map_child
      from pgflow.deps d
      join pgflow.steps cs on cs.flow_slug = d.flow_slug and cs.step_slug = d.step_slug and cs.step_type = 'map'
      join pgflow.step_states cst on cst.run_id = complete_task.run_id and cst.step_slug = d.step_slug
     where d.flow_slug = v_run.flow_slug
       and d.dep_slug = complete_task.step_slug
       and cst.initial_tasks is null
     limit 1;
    if v_map_child is not null then
      v_type := coalesce(pg_catalog.jsonb_typeof(complete_task.output), 'null');
      v_now := pg_catalog.now();
      update pgflow.step_tasks t
         set status = 'failed', failed_at = v_now, output = complete_task.output,
             error_message = '[TYPE_VIOLATION] Produced ' || v_type || ' instead of array'
       where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
         and t.task_index = complete_task.task_index;
      update pgflow.runs r set status = 'failed', failed_at = v_now
       where r.run_id = complete_task.run_id;
      perform realtime.send(
        pg_catalog.jsonb_build_object(
          'event_type', 'run:failed',
          'run_id', complete_task.run_id,
          'flow_slug', v_run.flow_slug,
          'status', 'failed',
          'failed_at', v_now),
        'run:failed',
        'pgflow:run:' || complete_task.run_id,
        false);
      update pgflow.step_states ss
         set status = 'failed', failed_at = v_now,
             error_message = '[TYPE_VIOLATION] Map step ' || v_map_child
                             || ' expects array input but dependency ' || complete_task.step_slug
                             || ' produced ' || v_type
       where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug
      returning * into v_completed;
      perform realtime.send(
        pg_catalog.jsonb_build_object(
          'event_type', 'step:failed',
          'run_id', complete_task.run_id,
          'step_slug', complete_task.step_slug,
          'status', 'failed',
          'error_message', v_completed.error_message,
          'failed_at', v_now),
        'step:' || complete_task.step_slug || ':failed',
        'pgflow:run:' || complete_task.run_id,
        false);
      -- Every other active task is cancelled first; then the culprit's and
      -- the cancelled tasks' messages are archived, per queue.
      for v_group in
        with cancelled as (
          update pgflow.step_tasks t
             set status = 'cancelled'
           where t.run_id = complete_task.run_id
             and t.status in ('queued', 'started')
          returning t.queue_name, t.message_id
        ), to_archive as (
          select c.queue_name, c.message_id from cancelled c
          union all
          select t.queue_name, t.message_id from pgflow.step_tasks t
           where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
             and t.task_index = complete_task.task_index
        )
        select a.queue_name, pg_catalog.array_agg(a.message_id order by a.message_id) as ids
          from to_archive a
         where a.message_id is not null
         group by a.queue_name
         order by a.queue_name
      loop
        perform pgmq.archive(v_group.queue_name, v_group.ids);
      end loop;
      return query select * from pgflow.step_tasks t
        where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
          and t.task_index = complete_task.task_index;
      return;
    end if;
  end if;

  -- The task completes (only from started); its step counts down.
  update pgflow.step_tasks t
     set status = 'completed', completed_at = pg_catalog.now(), output = complete_task.output
   where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
     and t.task_index = complete_task.task_index and t.status = 'started';

  if found then
    -- One update counts the step down and, with its last task, completes
    -- it with its output: a single step's task output, a map's task outputs
    -- in task_index order, those of its completed tasks (this one included;
    -- one row version, not two).
    update pgflow.step_states ss
       set remaining_tasks = ss.remaining_tasks - 1,
           status = case when ss.remaining_tasks = 1 then 'completed' else ss.status end,
           completed_at = case when ss.remaining_tasks = 1 then pg_catalog.now() else ss.completed_at end,
           output = case
                      when ss.remaining_tasks is distinct from 1 then ss.output
                      when v_step.step_type = 'map'
                        then coalesce((select pg_catalog.jsonb_agg(t.output order by t.task_index)
                                         from pgflow.step_tasks t
                                        where t.run_id = complete_task.run_id
                                          and t.step_slug = complete_task.step_slug
                                          and t.status = 'completed'), '[]'::jsonb)
                      else complete_task.output end
     where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug
    returning * into v_state;

    if v_state.remaining_tasks = 0 then
      v_completed := v_state;

      -- Dependents lose one dependency; a dependent map whose size is still
      -- unknown learns it: a map parent's completed task count, else its
      -- output array's length.
      update pgflow.step_states child
         set remaining_deps = child.remaining_deps - 1,
             initial_tasks = case
               when cs.step_type <> 'map' or child.initial_tasks is not null then child.initial_tasks
               when v_step.step_type = 'map'
                 then (select pg_catalog.count(*)::integer from pgflow.step_tasks t
                        where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
                          and t.status = 'completed')
               when pg_catalog.jsonb_typeof(v_completed.output) = 'array'
                 then pg_catalog.jsonb_array_length(v_completed.output)
               else null end
        from pgflow.deps d, pgflow.steps cs
       where d.flow_slug = v_state.flow_slug and d.dep_slug = complete_task.step_slug
         and cs.flow_slug = d.flow_slug and cs.step_slug = d.step_slug
         and child.run_id = complete_task.run_id and child.step_slug = d.step_slug;

      update pgflow.runs r set remaining_steps = r.remaining_steps - 1
       where r.run_id = complete_task.run_id;

      perform realtime.send(
        pg_catalog.jsonb_build_object(
          'event_type', 'step:completed',
          'run_id', complete_task.run_id,
          'step_slug', complete_task.step_slug,
          'status', 'completed',
          'output', v_completed.output,
          'completed_at', v_completed.completed_at),
        'step:' || complete_task.step_slug || ':completed',
        'pgflow:run:' || complete_task.run_id,
        false);

      if not pgflow.cascade_resolve_conditions(complete_task.run_id) then
        perform pgflow._archive_task_message(complete_task.run_id, complete_task.step_slug, complete_task.task_index);
        return query select * from pgflow.step_tasks t
          where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
            and t.task_index = complete_task.task_index;
        return;
      end if;
      perform pgflow.cascade_complete_taskless_steps(complete_task.run_id);
    end if;
  end if;

  -- The task's message, archived in the task's own queue, only when the
  -- task is completed now. A report for a task that is not started (a slow
  -- worker's, after requeue_stalled_tasks or a retry put the task back to
  -- queued) changed nothing above and must leave the message where it is:
  -- it is the only way the queued task can be claimed again. A duplicate
  -- report for a completed task re-attempts the archive, which finds
  -- nothing. (What _archive_task_message does, written out on this path
  -- taken once per task: a SQL function is planned afresh at every call.)
  perform pgmq.archive(t.queue_name, t.message_id)
     from pgflow.step_tasks t
    where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
      and t.task_index = complete_task.task_index and t.message_id is not null
      and t.status = 'completed';
  perform pgflow.start_ready_steps(complete_task.run_id);
  perform pgflow.maybe_complete_run(complete_task.run_id);

  return query select * from pgflow.step_tasks t
    where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
      and t.task_index = complete_task.task_index;
end
$$;

-- A worker's failure report. Retries while attempts are left (the message
-- comes back after the retry delay); once exhausted, the step's
-- when_exhausted decides: fail the run, skip the step, or skip it with its
-- dependents. Returns the task row in every case.
create or replace function pgflow.fail_task(run_id uuid, step_slug text, task_index integer, error_message text)
returns setof pgflow.step_tasks
language plpgsql
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_state pgflow.step_states;
  v_step pgflow.steps;
  v_flow pgflow.flows;
  v_task pgflow.step_tasks;
  v_max_attempts integer;
  v_base_delay integer;
  v_now timestamptz;
  v_group record;
  v_first_skip boolean;
begin
  if exists (select 1 from pgflow.runs r
              where r.run_id = fail_task.run_id and r.status = 'failed') then
    perform pgflow._archive_task_message(fail_task.run_id, fail_task.step_slug, fail_task.task_index);
    return query select * from pgflow.step_tasks t
      where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
        and t.task_index = fail_task.task_index;
    return;
  end if;

  -- The run and the step's state, locked together in one statement (with
  -- no state row nothing is locked, and the report falls through to the
  -- task's own checks), then read as they are now.
  perform 1
     from pgflow.runs r
     join pgflow.step_states ss on ss.run_id = r.run_id and ss.step_slug = fail_task.step_slug
    where r.run_id = fail_task.run_id
      for update of r, ss;
  select * into v_run from pgflow.runs r where r.run_id = fail_task.run_id;
  select * into v_state from pgflow.step_states ss
   where ss.run_id = fail_task.run_id and ss.step_slug = fail_task.step_slug;

  if v_run.status = 'failed' or v_state.status <> 'started' then
    perform pgflow._archive_task_message(fail_task.run_id, fail_task.step_slug, fail_task.task_index);
    return query select * from pgflow.step_tasks t
      where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
        and t.task_index = fail_task.task_index;
    return;
  end if;

  select * into v_task from pgflow.step_tasks t
   where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
     and t.task_index = fail_task.task_index;
  select * into v_step from pgflow.steps s
   where s.flow_slug = v_run.flow_slug and s.step_slug = fail_task.step_slug;
  select * into v_flow from pgflow.flows f where f.flow_slug = v_run.flow_slug;
  v_max_attempts := coalesce(v_step.opt_max_attempts, v_flow.opt_max_attempts);
  v_base_delay := coalesce(v_step.opt_base_delay, v_flow.opt_base_delay);

  -- Only a started task changes (each update below is guarded by it).
  -- Attempts left: back to queued.
  if v_task.status = 'started' and v_task.attempts_count < v_max_attempts then
    update pgflow.step_tasks t
       set status = 'queued', started_at = null, error_message = fail_task.error_message
     where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
       and t.task_index = fail_task.task_index and t.status = 'started';
  elsif v_task.status = 'started' then
    -- Exhausted.
    v_now := pg_catalog.now();
    update pgflow.step_tasks t
       set status = 'failed', failed_at = v_now, error_message = fail_task.error_message
     where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
       and t.task_index = fail_task.task_index and t.status = 'started';

    if not found then
      null;  -- no longer started (a concurrent requeue or claim): nothing else changes
    elsif v_step.when_exhausted = 'fail' then
      update pgflow.step_states ss
         set status = 'failed', failed_at = v_now, error_message = fail_task.error_message
       where ss.run_id = fail_task.run_id and ss.step_slug = fail_task.step_slug;
      update pgflow.runs r set status = 'failed', failed_at = v_now
       where r.run_id = fail_task.run_id;
      perform realtime.send(
        pg_catalog.jsonb_build_object(
          'event_type', 'step:failed',
          'run_id', fail_task.run_id,
          'step_slug', fail_task.step_slug,
          'status', 'failed',
          'error_message', fail_task.error_message,
          'failed_at', v_now),
        'step:' || fail_task.step_slug || ':failed',
        'pgflow:run:' || fail_task.run_id,
        false);
      perform realtime.send(
        pg_catalog.jsonb_build_object(
          'event_type', 'run:failed',
          'run_id', fail_task.run_id,
          'flow_slug', v_run.flow_slug,
          'status', 'failed',
          'error_message', fail_task.error_message,
          'failed_at', v_now),
        'run:failed',
        'pgflow:run:' || fail_task.run_id,
        false);
      -- Every active task of the run is cancelled first, then archived per queue.
      for v_group in
        with cancelled as (
          update pgflow.step_tasks t
             set status = 'cancelled'
           where t.run_id = fail_task.run_id
             and t.status in ('queued', 'started')
          returning t.queue_name, t.message_id
        )
        select c.queue_name, pg_catalog.array_agg(c.message_id order by c.message_id) as ids
          from cancelled c
         where c.message_id is not null
         group by c.queue_name
         order by c.queue_name
      loop
        perform pgmq.archive(v_group.queue_name, v_group.ids);
      end loop;
    else
      -- skip / skip-cascade: the step is skipped for handler_failed.
      update pgflow.step_states ss
         set status = 'skipped', skip_reason = 'handler_failed', skipped_at = v_now,
             error_message = fail_task.error_message, remaining_tasks = null
       where ss.run_id = fail_task.run_id and ss.step_slug = fail_task.step_slug
         and ss.status <> 'skipped';
      v_first_skip := found;
      if v_first_skip then
        update pgflow.runs r set remaining_steps = r.remaining_steps - 1
         where r.run_id = fail_task.run_id;
      end if;
      -- The step's other active tasks are skipped first, then archived per queue.
      for v_group in
        with skipped as (
          update pgflow.step_tasks t
             set status = 'skipped'
           where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
             and t.status in ('queued', 'started')
          returning t.queue_name, t.message_id
        )
        select k.queue_name, pg_catalog.array_agg(k.message_id order by k.message_id) as ids
          from skipped k
         where k.message_id is not null
         group by k.queue_name
         order by k.queue_name
      loop
        perform pgmq.archive(v_group.queue_name, v_group.ids);
      end loop;
      perform realtime.send(
        pg_catalog.jsonb_build_object(
          'event_type', 'step:skipped',
          'run_id', fail_task.run_id,
          'step_slug', fail_task.step_slug,
          'status', 'skipped',
          'skip_reason', 'handler_failed',
          'error_message', fail_task.error_message,
          'skipped_at', v_now),
        'step:' || fail_task.step_slug || ':skipped',
        'pgflow:run:' || fail_task.run_id,
        false);

      if v_step.when_exhausted = 'skip-cascade' then
        perform pgflow._cascade_force_skip_steps(fail_task.run_id, fail_task.step_slug, 'handler_failed');
      elsif v_first_skip then
        -- skip: each dependent loses this dependency (a map whose only
        -- parent this was has no tasks).
        update pgflow.step_states child
           set remaining_deps = child.remaining_deps - 1,
               initial_tasks = case when cs.step_type = 'map' and cs.deps_count = 1 then 0 else child.initial_tasks end
          from pgflow.deps d, pgflow.steps cs
         where d.flow_slug = v_run.flow_slug and d.dep_slug = fail_task.step_slug
           and cs.flow_slug = d.flow_slug and cs.step_slug = d.step_slug
           and child.run_id = fail_task.run_id and child.step_slug = d.step_slug;
        if not pgflow.cascade_resolve_conditions(fail_task.run_id) then
          perform pgflow._archive_task_message(fail_task.run_id, fail_task.step_slug, fail_task.task_index);
          return query select * from pgflow.step_tasks t
            where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
              and t.task_index = fail_task.task_index;
          return;
        end if;
        perform pgflow.cascade_complete_taskless_steps(fail_task.run_id);
        perform pgflow.start_ready_steps(fail_task.run_id);
      end if;
      perform pgflow.maybe_complete_run(fail_task.run_id);
    end if;
  end if;

  -- Whatever happened above, the message follows the task row: a queued
  -- task's message reappears after the retry delay, a failed task's is
  -- archived. So a report for a task that is already queued again (after a
  -- retry or a requeue) also pushes its message back by the delay, as
  -- pgflow 0.17.0 does.
  select * into v_task from pgflow.step_tasks t
   where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
     and t.task_index = fail_task.task_index;
  if v_task.status = 'queued' and v_task.message_id is not null then
    perform pgmq.set_vt(v_task.queue_name, v_task.message_id,
                        pgflow.calculate_retry_delay(v_base_delay, v_task.attempts_count));
  elsif v_task.status = 'failed' and v_task.message_id is not null then
    perform pgmq.archive(v_task.queue_name, v_task.message_id);
  end if;
  return query select * from pgflow.step_tasks t
    where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
      and t.task_index = fail_task.task_index;
end
$$;

-- Recovers tasks whose worker vanished: started longer ago than the step's
-- (else the flow's) timeout + 30 s, on a started run and step. Under three
-- requeues they become queued with their message visible at once; the rest
-- are marked permanently stalled, and their messages archived (per queue)
-- only when the same call requeued something. Returns how many were
-- requeued.
create or replace function pgflow.requeue_stalled_tasks()
returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_groups jsonb;
  v_requeued integer;
  v_group jsonb;
  v_ids bigint[];
begin
  -- The task rows change in one statement: under three requeues a task
  -- goes back to queued, at three it is marked permanently stalled (it
  -- stays started). Rows another transaction holds are skipped.
  with stalled as (
    select t.run_id, t.step_slug, t.task_index, t.requeued_count < 3 as requeue
      from pgflow.step_tasks t
      join pgflow.runs r on r.run_id = t.run_id and r.status = 'started'
      join pgflow.step_states ss on ss.run_id = t.run_id and ss.step_slug = t.step_slug and ss.status = 'started'
      join pgflow.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
      join pgflow.flows f on f.flow_slug = t.flow_slug
     where t.status = 'started'
       and t.permanently_stalled_at is null
       and t.started_at < pg_catalog.now()
                          - pg_catalog.make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 30)
       for update of t skip locked
  ), requeued as (
    update pgflow.step_tasks t
       set status = 'queued', started_at = null, last_worker_id = null,
           requeued_count = t.requeued_count + 1, last_requeued_at = pg_catalog.now()
      from stalled x
     where x.requeue
       and t.run_id = x.run_id and t.step_slug = x.step_slug and t.task_index = x.task_index
    returning t.queue_name, t.message_id, true as requeue
  ), given_up as (
    update pgflow.step_tasks t
       set permanently_stalled_at = pg_catalog.now()
      from stalled x
     where not x.requeue
       and t.run_id = x.run_id and t.step_slug = x.step_slug and t.task_index = x.task_index
    returning t.queue_name, t.message_id, false as requeue
  ), touched as (
    select * from requeued union all select * from given_up
  ), groups as (
    select x.queue_name, x.requeue, pg_catalog.count(*)::integer as n,
           pg_catalog.array_agg(x.message_id order by x.message_id) filter (where x.message_id is not null) as ids
      from touched x
     group by x.queue_name, x.requeue
  )
  select coalesce(pg_catalog.sum(g.n) filter (where g.requeue), 0)::integer,
         pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('queue', g.queue_name, 'requeue', g.requeue, 'ids', g.ids)
                              order by g.queue_name, g.requeue)
    into v_requeued, v_groups
    from groups g;

  -- The messages, as pgflow 0.17.0 treats them: only when at least one
  -- task was requeued are the requeued tasks' messages made visible at once
  -- and the permanently stalled tasks' messages archived. When nothing was
  -- requeued, the newly stalled tasks' messages are left in their queues
  -- untouched (later calls skip those tasks, so nothing archives them here).
  if v_requeued = 0 then
    return 0;
  end if;
  for v_group in select e.value from pg_catalog.jsonb_array_elements(v_groups) e loop
    if pg_catalog.jsonb_typeof(v_group -> 'ids') <> 'array' then
      continue;
    end if;
    v_ids := array(select e.value::bigint from pg_catalog.jsonb_array_elements_text(v_group -> 'ids') e);
    if (v_group ->> 'requeue')::boolean then
      perform pgflow.set_vt_batch(v_group ->> 'queue', v_ids,
                                  pg_catalog.array_fill(0, array[pg_catalog.cardinality(v_ids)]));
    else
      perform pgmq.archive(v_group ->> 'queue', v_ids);
    end if;
  end loop;
  return v_requeued;
end
$$;

-- Creates a flow (an existing one is returned as it is). A new flow may not
-- take a name pgmq already lists; a flow-mode flow gets its queue,
-- lower(slug), unless a queue of that name (in any case) is listed.
create or replace function pgflow.create_flow(flow_slug text, max_attempts integer default null,
                                              base_delay integer default null, timeout integer default null)
returns pgflow.flows
language plpgsql
set search_path = ''
as $$
declare
  v_flow pgflow.flows;
  v_queue text := pg_catalog.lower(create_flow.flow_slug);
begin
  perform pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(v_queue));

  -- A listed queue of this name refuses a new flow. Only when no flow of
  -- this name in any case exists: a case variant of an existing flow is
  -- refused by the unique index on lower(flow_slug) below instead.
  if not exists (select 1 from pgflow.flows f where pg_catalog.lower(f.flow_slug) = v_queue)
     and exists (select 1 from pgmq.list_queues() q where pg_catalog.lower(q.queue_name::text) = v_queue) then
    raise exception 'cannot create flow "%": queue "%" is already in use by another owner', create_flow.flow_slug, v_queue
      using errcode = 'unique_violation';
  end if;

  -- Insert, or return the existing row unchanged (locked by a no-op update).
  insert into pgflow.flows as f (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout)
  values (create_flow.flow_slug,
          coalesce(create_flow.max_attempts, 3),
          coalesce(create_flow.base_delay, 5),
          coalesce(create_flow.timeout, 60))
  on conflict on constraint flows_pkey do update set flow_slug = f.flow_slug
  returning * into v_flow;

  -- A flow-mode flow's queue, unless a queue of that name (in any case) is
  -- listed; a step-mode flow has no flow queue.
  if v_flow.queue_mode = 'flow'
     and not exists (select 1 from pgmq.list_queues() q where pg_catalog.lower(q.queue_name::text) = v_queue) then
    perform pgmq.create(v_queue);
  end if;
  return v_flow;
end
$$;

-- Adds a step to a flow-mode flow (step-mode flows come only from startup
-- compilation). Its queue is the flow's, lower(flow_slug). An existing step
-- is returned as it is: a conflict never changes a route.
create or replace function pgflow.add_step(
  flow_slug text,
  step_slug text,
  deps_slugs text[] default '{}',
  max_attempts integer default null,
  base_delay integer default null,
  timeout integer default null,
  start_delay integer default null,
  step_type text default 'single',
  required_input_pattern jsonb default null,
  forbidden_input_pattern jsonb default null,
  when_unmet text default 'skip',
  when_exhausted text default 'fail')
returns pgflow.steps
language plpgsql
set search_path = ''
as $$
declare
  v_step pgflow.steps;
  v_deps integer := coalesce(pg_catalog.array_length(add_step.deps_slugs, 1), 0);
begin
  perform pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(pg_catalog.lower(add_step.flow_slug)));

  -- The map rule is checked before the step-mode refusal.
  if coalesce(add_step.step_type, 'single') = 'map' and v_deps > 1 then
    raise exception 'Map step "%" can have at most one dependency, but % were provided: %',
      add_step.step_slug, v_deps, pg_catalog.array_to_string(add_step.deps_slugs, ', ');
  end if;
  if exists (select 1 from pgflow.flows f
              where f.flow_slug = add_step.flow_slug and f.queue_mode = 'step') then
    raise exception 'Flow "%" uses per-step queues: steps cannot be added incrementally.', add_step.flow_slug
      using detail = 'A step-mode definition is provisioned only by complete compilation.',
            hint = 'Recompile the complete flow definition with every step instead.';
  end if;

  -- Insert, or return the existing step unchanged (locked by a no-op
  -- update): a conflict never changes a route. The queue is the flow's.
  insert into pgflow.steps as s (flow_slug, step_slug, step_type, step_index, deps_count,
                                 opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay,
                                 required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted,
                                 queue_name)
  values (add_step.flow_slug, add_step.step_slug, coalesce(add_step.step_type, 'single'),
          coalesce((select pg_catalog.max(x.step_index) + 1 from pgflow.steps x where x.flow_slug = add_step.flow_slug), 0),
          v_deps,
          add_step.max_attempts, add_step.base_delay, add_step.timeout, add_step.start_delay,
          add_step.required_input_pattern, add_step.forbidden_input_pattern,
          add_step.when_unmet, add_step.when_exhausted,
          pg_catalog.lower(add_step.flow_slug))
  on conflict on constraint steps_pkey do update set step_slug = s.step_slug
  returning * into v_step;

  insert into pgflow.deps (flow_slug, dep_slug, step_slug)
  select add_step.flow_slug, d.dep, add_step.step_slug
    from pg_catalog.unnest(coalesce(add_step.deps_slugs, '{}')) as d(dep)
  on conflict on constraint deps_pkey do nothing;

  return v_step;
end
$$;

-- Deletes a flow with all its data and queues: each distinct step queue,
-- plus lower(slug) in flow mode, dropped under the spelling pgmq lists (a
-- queue pgmq does not list makes the deletion fail).
create or replace function pgflow.delete_flow_and_data(p_flow_slug text)
returns void
language plpgsql
set search_path = ''
as $$
declare
  v_mode text;
  v_queue text;
begin
  perform pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(pg_catalog.lower(p_flow_slug)));

  -- Each distinct route (plus lower(slug) in flow mode) is dropped under
  -- the spelling pgmq lists. A route pgmq does not list is passed on as it
  -- is, as pgflow 0.17.0 does: pgmq 1.5.1's drop_queue then fails (42P01)
  -- and the whole deletion rolls back. The routes come in de-duplication
  -- order, which no ORDER BY fixes (upstream's is plan-dependent); it only
  -- decides which error is reported first.
  select f.queue_mode into v_mode from pgflow.flows f where f.flow_slug = p_flow_slug;
  if found then
    for v_queue in
      select s.queue_name from pgflow.steps s where s.flow_slug = p_flow_slug
      union
      select pg_catalog.lower(p_flow_slug) where v_mode = 'flow'
    loop
      perform pgmq.drop_queue(pgflow._listed_queue_name(v_queue));
    end loop;
  end if;

  delete from pgflow.step_tasks t where t.flow_slug = p_flow_slug;
  delete from pgflow.step_states ss where ss.flow_slug = p_flow_slug;
  delete from pgflow.runs r where r.flow_slug = p_flow_slug;
  delete from pgflow.deps d where d.flow_slug = p_flow_slug;
  delete from pgflow.steps s where s.flow_slug = p_flow_slug;
  delete from pgflow.flows f where f.flow_slug = p_flow_slug;
end
$$;

-- The stricter slug rule: 1-128 characters of letters, digits and
-- underscores, starting with a letter, ending with a letter or digit, no
-- double underscore (so no slug looks like a step queue, flow__step), not
-- the reserved word run.
create or replace function pgflow.is_valid_slug(slug text)
returns boolean
language plpgsql
immutable
set search_path = ''
as $$
begin
  return slug is not null
     and slug <> ''
     and pg_catalog.length(slug) <= 128
     and slug ~ '^[a-zA-Z_][a-zA-Z0-9_]*$'
     and slug <> 'run'
     and slug ~ '^[a-zA-Z]'
     and slug ~ '[a-zA-Z0-9]$'
     and pg_catalog.strpos(slug, '__') = 0;
end
$$;

-- May a step-mode flow use this queue? Raises when another flow routes to it
-- (as a step queue or as its flow-mode queue), when pgmq lists it more than
-- once, or when it is listed without being this flow's route. False: the
-- flow owns it already (reuse); true: it must be created.
create function pgflow._assert_step_queue_available(p_flow_slug text, p_queue_name text)
returns boolean
language plpgsql
set search_path = ''
as $$
declare
  v_other text;
  v_listed text[];
begin
  -- Another flow (compared case-insensitively) routes to it: as a step
  -- queue, or as its flow-mode queue.
  select s.flow_slug into v_other
    from pgflow.steps s
   where s.queue_name = p_queue_name
     and pg_catalog.lower(s.flow_slug) <> pg_catalog.lower(p_flow_slug)
   limit 1;
  if v_other is null then
    select f.flow_slug into v_other
      from pgflow.flows f
     where f.queue_mode = 'flow'
       and pg_catalog.lower(f.flow_slug) = p_queue_name
       and pg_catalog.lower(f.flow_slug) <> pg_catalog.lower(p_flow_slug)
     limit 1;
  end if;
  if v_other is not null then
    raise exception 'cannot create flow "%": queue "%" is already used by another flow ("%")', p_flow_slug, p_queue_name, v_other
      using detail = 'Generated per-step queue names must belong to exactly one concrete flow.',
            hint = 'Use a different concrete flow slug, or drop the conflicting definition.';
  end if;

  -- The listed spellings, in the database's default collation order.
  select pg_catalog.array_agg(q.queue_name::text order by q.queue_name::text) into v_listed
    from pgmq.list_queues() q
   where pg_catalog.lower(q.queue_name::text) = p_queue_name;
  if pg_catalog.cardinality(v_listed) > 1 then
    raise exception 'queue "%" matches multiple listed PGMQ queues (%)', p_queue_name, v_listed
      using detail = 'An ambiguous case-insensitive match is external damage.',
            hint = 'Resolve the duplicate queue spellings manually, then retry.';
  end if;

  if exists (select 1 from pgflow.steps s
              where s.flow_slug = p_flow_slug and s.queue_name = p_queue_name) then
    return false;
  end if;
  if v_listed is not null then
    raise exception 'cannot create flow "%": queue "%" is already listed in PGMQ and not owned by this flow', p_flow_slug, p_queue_name
      using detail = 'A missing definition must not adopt an already listed queue.',
            hint = 'Drop the conflicting queue or use a different concrete flow slug.';
  end if;
  return true;
end
$$;

-- Re-adding the slug checks re-checks every existing slug against the
-- stricter rule (definitions unchanged).
alter table pgflow.flows drop constraint slug_is_valid;
alter table pgflow.flows add constraint slug_is_valid check (pgflow.is_valid_slug(flow_slug));
alter table pgflow.steps drop constraint steps_step_slug_check;
alter table pgflow.steps add constraint steps_step_slug_check check (pgflow.is_valid_slug(step_slug));

-- ---------------------------------------------------------------------------
-- C3. Compilation and claiming entry points of the 0.17 protocol.
-- ---------------------------------------------------------------------------

-- Builds a flow from a FlowShape (a NULL mode is flow mode). Flow mode:
-- create_flow, then add_step per step. Step mode: every route is derived
-- and checked before anything changes, the missing queues are created, then
-- the flow and, step by step, each step (with its own queue) and its
-- dependencies are inserted.
create function pgflow._create_flow_from_shape(p_flow_slug text, p_shape jsonb, p_queue_mode text default 'flow')
returns void
language plpgsql
set search_path = ''
as $$
declare
  v_mode text := coalesce(p_queue_mode, 'flow');
  v_routes jsonb;
  v_route jsonb;
  v_step jsonb;
  v_index integer;
  v_opts jsonb := coalesce(p_shape -> 'options', '{}'::jsonb);
  v_step_opts jsonb;
  v_deps jsonb;
  v_create text[] := '{}';
  v_queue text;
begin
  perform pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(pg_catalog.lower(p_flow_slug)));
  v_routes := pgflow._derive_queue_routes(p_flow_slug, p_shape, v_mode);

  if v_mode = 'flow' then
    perform pgflow.create_flow(p_flow_slug,
                               (v_opts ->> 'maxAttempts')::integer,
                               (v_opts ->> 'baseDelay')::integer,
                               (v_opts ->> 'timeout')::integer);
    for v_step in select e.value from pg_catalog.jsonb_array_elements(p_shape -> 'steps') with ordinality e order by e.ordinality loop
      v_step_opts := coalesce(v_step -> 'options', '{}'::jsonb);
      perform pgflow.add_step(
        flow_slug => p_flow_slug,
        step_slug => v_step ->> 'slug',
        deps_slugs => coalesce(array(select d.value from pg_catalog.jsonb_array_elements_text(v_step -> 'dependencies') with ordinality d
                                      order by d.ordinality), '{}'),
        max_attempts => (v_step_opts ->> 'maxAttempts')::integer,
        base_delay => (v_step_opts ->> 'baseDelay')::integer,
        timeout => (v_step_opts ->> 'timeout')::integer,
        start_delay => (v_step_opts ->> 'startDelay')::integer,
        step_type => coalesce(v_step ->> 'stepType', 'single'),
        required_input_pattern => case when (v_step -> 'requiredInputPattern' ->> 'defined')::boolean
                                       then v_step -> 'requiredInputPattern' -> 'value' end,
        forbidden_input_pattern => case when (v_step -> 'forbiddenInputPattern' ->> 'defined')::boolean
                                        then v_step -> 'forbiddenInputPattern' -> 'value' end,
        when_unmet => coalesce(v_step ->> 'whenUnmet', 'skip'),
        when_exhausted => coalesce(v_step ->> 'whenExhausted', 'fail'));
    end loop;
    return;
  end if;

  -- Step mode: every route is checked before anything changes (the first
  -- failure wins), then the missing queues are created, then the flow row
  -- (an existing row of exactly this slug is kept as it is, locked by a
  -- no-op update), then step by step in shape order the step and its own
  -- dependencies. A dependency on a later step therefore fails (23503); a
  -- repeated one is stored once.
  for v_route in select e.value from pg_catalog.jsonb_array_elements(v_routes) with ordinality e order by e.ordinality loop
    if pgflow._assert_step_queue_available(p_flow_slug, v_route ->> 'queueName') then
      v_create := v_create || (v_route ->> 'queueName');
    end if;
  end loop;
  foreach v_queue in array v_create loop
    perform pgmq.create(v_queue);
  end loop;

  insert into pgflow.flows as f (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout, queue_mode)
  values (p_flow_slug,
          coalesce((v_opts ->> 'maxAttempts')::integer, 3),
          coalesce((v_opts ->> 'baseDelay')::integer, 5),
          coalesce((v_opts ->> 'timeout')::integer, 60),
          'step')
  on conflict on constraint flows_pkey do update set flow_slug = f.flow_slug;

  v_index := 0;
  for v_step in select e.value from pg_catalog.jsonb_array_elements(p_shape -> 'steps') with ordinality e order by e.ordinality loop
    v_step_opts := coalesce(v_step -> 'options', '{}'::jsonb);
    v_deps := coalesce(v_step -> 'dependencies', '[]'::jsonb);
    if coalesce(v_step ->> 'stepType', 'single') = 'map' and pg_catalog.jsonb_array_length(v_deps) > 1 then
      raise exception 'Map step "%" can have at most one dependency, but % were provided: %',
        v_step ->> 'slug', pg_catalog.jsonb_array_length(v_deps),
        (select pg_catalog.string_agg(d.value, ', ' order by d.ordinality)
           from pg_catalog.jsonb_array_elements_text(v_deps) with ordinality d);
    end if;
    insert into pgflow.steps (flow_slug, step_slug, step_type, step_index, deps_count,
                              opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay,
                              required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted,
                              queue_name)
    values (p_flow_slug, v_step ->> 'slug', coalesce(v_step ->> 'stepType', 'single'), v_index,
            pg_catalog.jsonb_array_length(v_deps),
            (v_step_opts ->> 'maxAttempts')::integer, (v_step_opts ->> 'baseDelay')::integer,
            (v_step_opts ->> 'timeout')::integer, (v_step_opts ->> 'startDelay')::integer,
            case when (v_step -> 'requiredInputPattern' ->> 'defined')::boolean
                 then v_step -> 'requiredInputPattern' -> 'value' end,
            case when (v_step -> 'forbiddenInputPattern' ->> 'defined')::boolean
                 then v_step -> 'forbiddenInputPattern' -> 'value' end,
            coalesce(v_step ->> 'whenUnmet', 'skip'), coalesce(v_step ->> 'whenExhausted', 'fail'),
            v_routes -> v_index ->> 'queueName');
    insert into pgflow.deps (flow_slug, dep_slug, step_slug)
    select p_flow_slug, d.value, v_step ->> 'slug'
      from pg_catalog.jsonb_array_elements_text(v_deps) d
    on conflict on constraint deps_pkey do nothing;
    v_index := v_index + 1;
  end loop;
end
$$;

-- The shape differences ensure_flow_compiled reports (and workers log and
-- match): p_local is the worker's shape ("first"), p_db the database's
-- ("second"), indexes 0-based. pgflow 0.17.0 keeps its 0.16.0 function;
-- it is defined here with exactly those texts, so that every upgraded
-- database reports them whatever copy it had. Slug, type, whenUnmet and
-- whenExhausted are compared as text with plain inequality (a key missing
-- on either side reports nothing); the patterns as whole jsonb wrappers
-- (a missing key differs from {"defined": false}); dependencies as lists
-- sorted in the database's collation.
create or replace function pgflow._compare_flow_shapes(p_local jsonb, p_db jsonb)
returns text[]
language plpgsql
stable
set search_path = ''
as $$
declare
  v_local jsonb := coalesce(p_local -> 'steps', '[]'::jsonb);
  v_db jsonb := coalesce(p_db -> 'steps', '[]'::jsonb);
  v_nl integer := pg_catalog.jsonb_array_length(v_local);
  v_nd integer := pg_catalog.jsonb_array_length(v_db);
  v_out text[] := '{}';
  v_l jsonb;
  v_d jsonb;
  v_ldeps text[];
  v_ddeps text[];
  v_key text;
  v_i integer;
begin
  if v_nl <> v_nd then
    v_out := v_out || pg_catalog.format('Step count differs: %s vs %s', v_nl, v_nd);
  end if;

  for v_i in 0 .. greatest(v_nl, v_nd) - 1 loop
    v_l := v_local -> v_i;
    v_d := v_db -> v_i;
    if v_l is null then
      v_out := v_out || pg_catalog.format('Step at index %s: missing in first shape (second has ''%s'')', v_i, v_d ->> 'slug');
      continue;
    end if;
    if v_d is null then
      v_out := v_out || pg_catalog.format('Step at index %s: missing in second shape (first has ''%s'')', v_i, v_l ->> 'slug');
      continue;
    end if;

    if (v_l ->> 'slug') <> (v_d ->> 'slug') then
      v_out := v_out || pg_catalog.format('Step at index %s: slug differs ''%s'' vs ''%s''', v_i, v_l ->> 'slug', v_d ->> 'slug');
    end if;
    if (v_l ->> 'stepType') <> (v_d ->> 'stepType') then
      v_out := v_out || pg_catalog.format('Step at index %s: type differs ''%s'' vs ''%s''', v_i, v_l ->> 'stepType', v_d ->> 'stepType');
    end if;

    v_ldeps := array(select e.value from pg_catalog.jsonb_array_elements_text(coalesce(v_l -> 'dependencies', '[]'::jsonb)) e
                      order by e.value);
    v_ddeps := array(select e.value from pg_catalog.jsonb_array_elements_text(coalesce(v_d -> 'dependencies', '[]'::jsonb)) e
                      order by e.value);
    if v_ldeps is distinct from v_ddeps then
      v_out := v_out || pg_catalog.format('Step at index %s: dependencies differ [%s] vs [%s]', v_i,
                                          pg_catalog.array_to_string(v_ldeps, ', '), pg_catalog.array_to_string(v_ddeps, ', '));
    end if;

    foreach v_key in array array['whenUnmet', 'whenExhausted'] loop
      if (v_l ->> v_key) <> (v_d ->> v_key) then
        v_out := v_out || pg_catalog.format('Step at index %s: %s differs ''%s'' vs ''%s''', v_i, v_key, v_l ->> v_key, v_d ->> v_key);
      end if;
    end loop;

    foreach v_key in array array['requiredInputPattern', 'forbiddenInputPattern'] loop
      if (v_l -> v_key) is distinct from (v_d -> v_key) then
        v_out := v_out || pg_catalog.format('Step at index %s: %s differs ''%s'' vs ''%s''', v_i, v_key, v_l -> v_key, v_d -> v_key);
      end if;
    end loop;
  end loop;

  return v_out;
end
$$;

-- The worker's startup call: compile a missing flow, verify an existing one
-- (shape, queue mode and the ordered step -> queue routes), recompile it on a
-- local database, or report the mismatch. A supplied route_map must equal the
-- derived routes entry for entry. A NULL queue mode is flow mode.
create function pgflow.ensure_flow_compiled(flow_slug text, shape jsonb, queue_mode text default 'flow',
                                            route_map jsonb default null)
returns jsonb
language plpgsql
set search_path = ''
as $$
declare
  v_mode text := coalesce(ensure_flow_compiled.queue_mode, 'flow');
  v_routes jsonb;
  v_count integer;
  v_i integer;
  v_given jsonb;
  v_derived jsonb;
  v_stored_mode text;
  v_stored_routes jsonb;
  v_shape_diffs text[];
  v_route_diffs text[] := '{}';
  v_diffs text[];
  v_route jsonb;
begin
  perform pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(pg_catalog.lower(ensure_flow_compiled.flow_slug)));

  -- The routes are derived (and the definition validated) before anything
  -- else is looked at. A supplied route map must then match them: its
  -- length first, then entry by entry on stepSlug and queueName (other keys
  -- are ignored); the first differing entry is reported, 1-based.
  v_routes := pgflow._derive_queue_routes(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape, v_mode);
  v_count := pg_catalog.jsonb_array_length(v_routes);
  if ensure_flow_compiled.route_map is not null then
    if pg_catalog.jsonb_array_length(ensure_flow_compiled.route_map) <> v_count then
      raise exception 'supplied route map for flow "%" has % entries but % step(s) was derived',
        ensure_flow_compiled.flow_slug, pg_catalog.jsonb_array_length(ensure_flow_compiled.route_map), v_count
        using detail = 'The route map must cover the complete ordered shape exactly.',
              hint = 'Pass withStepQueues() route snapshots or omit the map to let SQL derive it.';
    end if;
    for v_i in 0 .. v_count - 1 loop
      v_given := ensure_flow_compiled.route_map -> v_i;
      v_derived := v_routes -> v_i;
      if (v_given ->> 'stepSlug') is distinct from (v_derived ->> 'stepSlug')
         or (v_given ->> 'queueName') is distinct from (v_derived ->> 'queueName') then
        raise exception 'supplied route map for flow "%" disagrees with the derived route at position %',
          ensure_flow_compiled.flow_slug, v_i + 1
          using detail = pg_catalog.format('Supplied (%s, %s); derived (%s, %s).',
                                           v_given ->> 'stepSlug', v_given ->> 'queueName',
                                           v_derived ->> 'stepSlug', v_derived ->> 'queueName'),
                hint = 'SQL derives queue names from the flow slug, step slugs, and shape order; fix the supplied map.';
      end if;
    end loop;
  end if;

  select f.queue_mode into v_stored_mode from pgflow.flows f where f.flow_slug = ensure_flow_compiled.flow_slug;
  if not found then
    perform pgflow._create_flow_from_shape(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape, v_mode);
    return pg_catalog.jsonb_build_object('status', 'compiled', 'differences', '[]'::jsonb, 'mismatchKind', null);
  end if;

  -- Differences: the shape's (the worker's shape first, the database's
  -- second), then the queue mode, then the ordered step -> queue routes.
  -- Options are not compared.
  v_shape_diffs := coalesce(pgflow._compare_flow_shapes(ensure_flow_compiled.shape,
                                                        pgflow._get_flow_shape(ensure_flow_compiled.flow_slug)), '{}');
  if v_stored_mode is distinct from v_mode then
    v_route_diffs := v_route_diffs || pg_catalog.format('Queue mode differs: database has ''%s'', worker expects ''%s''',
                                                        v_stored_mode, v_mode);
  end if;
  select coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('stepSlug', s.step_slug, 'queueName', s.queue_name)
                                        order by s.step_index), '[]'::jsonb)
    into v_stored_routes
    from pgflow.steps s where s.flow_slug = ensure_flow_compiled.flow_slug;
  if v_stored_routes <> v_routes then
    v_route_diffs := v_route_diffs || pg_catalog.format('Step routes differ: database has [%s], worker expects [%s]',
      (select pg_catalog.string_agg((e.value ->> 'stepSlug') || ' -> ' || (e.value ->> 'queueName'), ', ' order by e.ordinality)
         from pg_catalog.jsonb_array_elements(v_stored_routes) with ordinality e),
      (select pg_catalog.string_agg((e.value ->> 'stepSlug') || ' -> ' || (e.value ->> 'queueName'), ', ' order by e.ordinality)
         from pg_catalog.jsonb_array_elements(v_routes) with ordinality e));
  end if;
  v_diffs := v_shape_diffs || v_route_diffs;

  if pg_catalog.cardinality(v_diffs) = 0 then
    if v_mode = 'step' then
      for v_route in select e.value from pg_catalog.jsonb_array_elements(v_routes) with ordinality e order by e.ordinality loop
        perform pgflow._assert_step_queue_available(ensure_flow_compiled.flow_slug, v_route ->> 'queueName');
      end loop;
    end if;
    return pg_catalog.jsonb_build_object('status', 'verified', 'differences', '[]'::jsonb, 'mismatchKind', null);
  end if;

  if pgflow.is_local() then
    perform pgflow.delete_flow_and_data(ensure_flow_compiled.flow_slug);
    perform pgflow._create_flow_from_shape(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape, v_mode);
    return pg_catalog.jsonb_build_object('status', 'recompiled', 'differences', pg_catalog.to_jsonb(v_diffs),
                                         'mismatchKind', null);
  end if;
  return pg_catalog.jsonb_build_object(
    'status', 'mismatch',
    'differences', pg_catalog.to_jsonb(v_diffs),
    'mismatchKind', case when pg_catalog.cardinality(v_shape_diffs) = 0 and pg_catalog.cardinality(v_route_diffs) > 0
                         then 'routing' else 'shape' end);
end
$$;

-- Claims the tasks behind messages a worker read from queue_name: flow mode
-- (no step_slug) or step mode (the step's own route). A task is claimed only
-- while queued on a started run and step; its message stays invisible for
-- the step's (else the flow's) timeout + 2 s, or the whole call fails.
create function pgflow.start_tasks(flow_slug text, msg_ids bigint[], worker_id uuid, queue_name text,
                                   step_slug text default null)
returns setof pgflow.step_task_record
language plpgsql
set search_path = ''
set plan_cache_mode = force_custom_plan
as $$
declare
  v_mode text;
  v_flow_timeout integer;
  v_out record;
begin
  select f.queue_mode, f.opt_timeout into v_mode, v_flow_timeout
    from pgflow.flows f where f.flow_slug = start_tasks.flow_slug;
  if not found then
    return;
  end if;
  -- An unknown flow claims nothing and is no error. Step mode needs the
  -- exact step selector of a persisted route; flow mode takes none (a
  -- wrong queue there simply claims nothing).
  if v_mode = 'step' then
    if start_tasks.step_slug is null then
      raise exception 'Flow "%" uses per-step queues: an exact step_slug is required to claim tasks.', start_tasks.flow_slug
        using detail = pg_catalog.format('Queue "%s" is a private step queue; a claim without a step selector could mix steps.',
                                         start_tasks.queue_name),
              hint = 'Pass the exact step_slug of the polled step; direct SQL cannot obtain flow-wide claims in step mode.';
    end if;
    if not exists (select 1 from pgflow.steps s
                    where s.flow_slug = start_tasks.flow_slug and s.step_slug = start_tasks.step_slug
                      and s.queue_name = start_tasks.queue_name) then
      raise exception 'Step "%" does not route to queue "%" in flow "%".', start_tasks.step_slug, start_tasks.queue_name, start_tasks.flow_slug
        using detail = 'The step selector must match a persisted step route (flow_slug, step_slug, queue_name) exactly.',
              hint = 'Poll the queue recorded for this step and pass its exact canonical name and spelling.';
    end if;
  elsif start_tasks.step_slug is not null then
    raise exception 'Flow "%" uses the default flow queue: a step selector is not allowed.', start_tasks.flow_slug
      using detail = pg_catalog.format('Step "%s" was supplied, but flow queue mode has no per-step queues.', start_tasks.step_slug),
            hint = 'Omit step_slug to claim flow-wide tasks.';
  end if;

  -- One statement claims, takes a root step's input from the run row it
  -- joined, and hides the claimed messages. This function is planned
  -- afresh at every call (force_custom_plan), so the statements are kept
  -- small: few joins each, and the dependency lookups only planned (below)
  -- when a claimed step has dependencies.
  --
  -- The claim is guarded: the candidates are found by their message
  -- through the unique (queue_name, message_id) index alone and read
  -- without locks; only the rows actually claimed are locked, by the update
  -- itself, which re-checks that each is still queued (a row a concurrent
  -- claim took is left out). Finding them by that index alone keeps the
  -- plan cheap whatever the statistics say (after a burst of new runs they
  -- are stale, and a plan chosen from them can scan every queued task).
  with locked as materialized (
    select k.run_id, k.step_slug, k.task_index, k.flow_slug, k.status
      from pgflow.step_tasks k
     where k.queue_name = start_tasks.queue_name
       and k.message_id = any (start_tasks.msg_ids)
  ), claimable as materialized (
    select l.run_id, l.step_slug, l.task_index
      from locked l
     where l.flow_slug = start_tasks.flow_slug
       and (start_tasks.step_slug is null or l.step_slug = start_tasks.step_slug)
       and l.status = 'queued'
       and exists (select 1 from pgflow.runs r where r.run_id = l.run_id and r.status = 'started')
       and exists (select 1 from pgflow.step_states ss
                    where ss.run_id = l.run_id and ss.step_slug = l.step_slug and ss.status = 'started')
  ), claimed as (
    update pgflow.step_tasks t
       set status = 'started',
           attempts_count = t.attempts_count + 1,
           started_at = pg_catalog.now(),
           last_worker_id = start_tasks.worker_id
      from claimable c, pgflow.runs r
     where t.run_id = c.run_id and t.step_slug = c.step_slug and t.task_index = c.task_index
       and t.status = 'queued'
       and r.run_id = t.run_id
    returning t.run_id, t.step_slug, t.task_index, t.message_id, r.input as run_input
  ), tasks as (
    select c.run_id, c.step_slug, c.task_index, c.message_id,
           coalesce(s.opt_timeout, v_flow_timeout) + 2 as vt,
           s.deps_count > 0 as has_deps,
           case
             when s.deps_count > 0 then null  -- filled in below
             when s.step_type = 'map' then c.run_input -> c.task_index
             else '{}'::jsonb
           end as input,
           case when s.step_type = 'single' and s.deps_count = 0 then c.run_input end as flow_input
      from claimed c
      join pgflow.steps s on s.flow_slug = start_tasks.flow_slug and s.step_slug = c.step_slug
  ), agg as (
    select pg_catalog.array_agg(k.run_id order by k.message_id) as run_ids,
           pg_catalog.array_agg(k.step_slug order by k.message_id) as step_slugs,
           pg_catalog.array_agg(k.input order by k.message_id) as inputs,
           pg_catalog.array_agg(k.message_id order by k.message_id) as ids,
           pg_catalog.array_agg(k.task_index order by k.message_id) as task_indexes,
           pg_catalog.array_agg(k.flow_input order by k.message_id) as flow_inputs,
           pg_catalog.array_agg(k.vt order by k.message_id) as vts,
           pg_catalog.bool_or(k.has_deps) as has_deps
      from tasks k
  )
  select a.run_ids, a.step_slugs, a.inputs, a.ids, a.task_indexes, a.flow_inputs, a.has_deps,
         (select pg_catalog.count(*)::integer
            from pgflow.set_vt_batch(start_tasks.queue_name, a.ids, a.vts)) as hidden
    from agg a
   where a.ids is not null
    into v_out;

  if not found then
    return;  -- nothing claimed
  end if;
  -- A claimed task whose message is not in the queue fails the whole
  -- call, so no task stays claimed and no attempt is counted. pgflow 0.17.0
  -- fails it with a deliberate text-to-integer cast (22P02) whose text
  -- says what happened; the same cast fails here, for the same answer.
  if v_out.hidden < pg_catalog.cardinality(v_out.ids) then
    v_out.hidden := pg_catalog.format('start_tasks(): visibility updated %s of %s claimed messages',
                                      v_out.hidden, pg_catalog.cardinality(v_out.ids))::integer;
  end if;

  -- The rows come in message order (pgflow 0.17.0 defines no order).
  if not v_out.has_deps then
    return query
    select start_tasks.flow_slug, o.run_id, o.step_slug, o.input, o.msg_id, o.task_index, o.flow_input
      from rows from (pg_catalog.unnest(v_out.run_ids), pg_catalog.unnest(v_out.step_slugs), pg_catalog.unnest(v_out.inputs),
                     pg_catalog.unnest(v_out.ids), pg_catalog.unnest(v_out.task_indexes), pg_catalog.unnest(v_out.flow_inputs))
             as o(run_id, step_slug, input, msg_id, task_index, flow_input)
     order by o.msg_id;
    return;
  end if;

  -- A dependent step's input: a map's element of its dependency's output
  -- array, else the completed dependencies' outputs keyed by slug.
  return query
  select start_tasks.flow_slug, o.run_id, o.step_slug,
         case
           when s.deps_count = 0 then o.input
           when s.step_type = 'map' then
             (select ds.output -> o.task_index
                from pgflow.deps d
                join pgflow.step_states ds on ds.run_id = o.run_id and ds.step_slug = d.dep_slug
               where d.flow_slug = start_tasks.flow_slug and d.step_slug = o.step_slug
               limit 1)
           else coalesce((select pg_catalog.jsonb_object_agg(d.dep_slug, ds.output)
                            from pgflow.deps d
                            join pgflow.step_states ds
                              on ds.run_id = o.run_id and ds.step_slug = d.dep_slug and ds.status = 'completed'
                           where d.flow_slug = start_tasks.flow_slug and d.step_slug = o.step_slug), '{}'::jsonb)
         end,
         o.msg_id, o.task_index, o.flow_input
    from rows from (pg_catalog.unnest(v_out.run_ids), pg_catalog.unnest(v_out.step_slugs), pg_catalog.unnest(v_out.inputs),
                     pg_catalog.unnest(v_out.ids), pg_catalog.unnest(v_out.task_indexes), pg_catalog.unnest(v_out.flow_inputs))
           as o(run_id, step_slug, input, msg_id, task_index, flow_input)
    join pgflow.steps s on s.flow_slug = start_tasks.flow_slug and s.step_slug = o.step_slug
   order by o.msg_id;
end
$$;

-- ---------------------------------------------------------------------------
-- C4. The 0.16.0 entry points go. A 0.16.0 worker still compiles (its
--     two-argument call resolves to the new ensure_flow_compiled through the
--     defaults) and registers, then fails at its first non-empty claim with
--     42883; nothing is claimed and its messages come back after their vt.
-- ---------------------------------------------------------------------------
drop function if exists pgflow.start_tasks(text, bigint[], uuid, text);
drop function pgflow.ensure_flow_compiled(text, jsonb);
drop function pgflow._create_flow_from_shape(text, jsonb);
drop function pgflow.start_tasks(text, bigint[], uuid);
