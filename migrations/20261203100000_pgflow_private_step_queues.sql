-- pgflow_private_step_queues (20261203100000): pgflow 0.16.0 -> pgflow 0.17.0.
--
-- The end state is exactly upstream pgflow's 0.17.0 schema (its migration
-- 20260915074120_pgflow_private_step_queues): queue identity stored on
-- steps and step_tasks, case-insensitively unique slugs under the stricter
-- slug rule, flows.queue_mode ('flow' | 'step', private per-step queues), the
-- five-argument start_tasks, and every engine function addressing messages
-- by the stored queue name, realtime broadcasts unchanged. Written here from
-- the facts of that change; nothing of the tool's own lives in schema pgflow.
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
  select pg_catalog.array_agg(q.queue_name::text order by q.queue_name)
    into v_names
    from pgmq.list_queues() q
   where pg_catalog.lower(q.queue_name::text) = pg_catalog.lower(p_queue_name);
  if v_names is null then
    return p_queue_name;
  end if;
  if pg_catalog.cardinality(v_names) > 1 then
    raise exception 'pgmq lists more than one queue named % in some case: %', p_queue_name, v_names
      using errcode = 'ambiguous_alias',
            hint = 'Drop the extra queues so that one spelling is left.';
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
  v_fallback text := pg_catalog.lower(p_flow_slug || '__' || p_step_index::text);
begin
  if pg_catalog.length(v_readable) <= 47 then
    return v_readable;
  end if;
  if pg_catalog.length(pg_catalog.lower(p_flow_slug || '__0')) > 47 then
    raise exception 'flow slug % is too long for step queues: % is over 47 characters', p_flow_slug, pg_catalog.lower(p_flow_slug || '__0')
      using errcode = 'invalid_parameter_value',
            hint = 'Use a shorter flow slug for a step-mode flow.';
  end if;
  if pg_catalog.length(v_fallback) > 47 then
    raise exception 'no step queue name fits 47 characters for step % of flow % (tried % and %)', p_step_slug, p_flow_slug, v_readable, v_fallback
      using errcode = 'invalid_parameter_value';
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
  v_steps jsonb := coalesce(p_shape -> 'steps', '[]'::jsonb);
  v_step jsonb;
  v_slug text;
  v_name text;
  v_index integer := 0;
  v_routes jsonb := '[]'::jsonb;
  v_seen_slugs text[] := '{}';
  v_seen_names text[] := '{}';
begin
  if p_queue_mode is null or p_queue_mode not in ('flow', 'step') then
    raise exception 'queue mode must be ''flow'' or ''step'', got %', coalesce(p_queue_mode, 'NULL')
      using errcode = 'invalid_parameter_value';
  end if;
  if pg_catalog.jsonb_typeof(v_steps) <> 'array' then
    raise exception 'flow shape of % has no steps array', p_flow_slug
      using errcode = 'invalid_parameter_value';
  end if;
  if p_queue_mode = 'step' and pg_catalog.jsonb_array_length(v_steps) = 0 then
    raise exception 'step-mode flow % needs at least one step', p_flow_slug
      using errcode = 'invalid_parameter_value';
  end if;
  if not coalesce(pgflow.is_valid_slug(p_flow_slug), false) then
    raise exception 'invalid flow slug: %', p_flow_slug
      using errcode = 'invalid_parameter_value',
            hint = 'A slug starts with a letter, ends with a letter or digit, has only letters, digits and single underscores, and is at most 128 characters.';
  end if;
  for v_step in select e.value from pg_catalog.jsonb_array_elements(v_steps) e loop
    v_slug := v_step ->> 'slug';
    if not coalesce(pgflow.is_valid_slug(v_slug), false) then
      raise exception 'invalid step slug % in flow %', coalesce(v_slug, 'NULL'), p_flow_slug
        using errcode = 'invalid_parameter_value';
    end if;
    if pg_catalog.lower(v_slug) = any (v_seen_slugs) then
      raise exception 'step slugs of flow % repeat case-insensitively: %', p_flow_slug, v_slug
        using errcode = 'invalid_parameter_value';
    end if;
    v_seen_slugs := v_seen_slugs || pg_catalog.lower(v_slug);
    if p_queue_mode = 'step' then
      v_name := pgflow._resolve_step_queue_name(p_flow_slug, v_slug, v_index);
      perform pgmq.validate_queue_name(v_name);
      if v_name = any (v_seen_names) then
        raise exception 'step queue name % repeats in flow %', v_name, p_flow_slug
          using errcode = 'invalid_parameter_value';
      end if;
      v_seen_names := v_seen_names || v_name;
    else
      v_name := pg_catalog.lower(p_flow_slug);
    end if;
    v_routes := v_routes || pg_catalog.jsonb_build_array(
      pg_catalog.jsonb_build_object('stepSlug', v_slug, 'queueName', v_name));
    v_index := v_index + 1;
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
  v_ids bigint[];
begin
  select r.status into v_status from pgflow.runs r where r.run_id = start_ready_steps.run_id;
  if v_status in ('completed', 'failed') then
    return;
  end if;

  -- The ready steps, locked, in slug order (usually none: then this indexed
  -- read is the whole call). Each is started, broadcast, sent and recorded.
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

    select pg_catalog.array_agg(m.id order by m.ord) into v_ids
      from pgmq.send_batch(
             v_step.queue_name,
             array(select pg_catalog.jsonb_build_object(
                            'flow_slug', v_step.flow_slug,
                            'run_id', v_started.run_id,
                            'step_slug', v_step.step_slug,
                            'task_index', i)
                     from pg_catalog.generate_series(0, v_started.initial_tasks - 1) i
                    order by i),
             v_step.start_delay) with ordinality as m(id, ord);

    insert into pgflow.step_tasks (flow_slug, run_id, step_slug, task_index, message_id, queue_name)
    select v_step.flow_slug, v_started.run_id, v_step.step_slug, (m.ord - 1)::integer, m.id, v_step.queue_name
      from pg_catalog.unnest(v_ids) with ordinality as m(id, ord);
  end loop;
end
$$;

-- Skips a step and every transitive dependent still created or started,
-- their active tasks, and those tasks' messages (per queue).
create or replace function pgflow._cascade_force_skip_steps(run_id uuid, step_slug text, skip_reason text)
returns integer
language plpgsql
as $$
declare
  v_flow_slug text;
  v_slugs text[];
  v_reasons text[];
  v_times timestamptz[];
  v_skipped record;
  v_group record;
begin
  select r.flow_slug into v_flow_slug
    from pgflow.runs r where r.run_id = _cascade_force_skip_steps.run_id;
  if not found then
    raise exception 'run % not found', _cascade_force_skip_steps.run_id
      using errcode = 'no_data_found';
  end if;

  with recursive tree(step_slug) as (
    select _cascade_force_skip_steps.step_slug
    union
    select d.step_slug
      from pgflow.deps d
      join tree on d.dep_slug = tree.step_slug
     where d.flow_slug = v_flow_slug
  ), skipped as (
    update pgflow.step_states ss
       set status = 'skipped',
           skip_reason = case when ss.step_slug = _cascade_force_skip_steps.step_slug
                              then _cascade_force_skip_steps.skip_reason
                              else 'dependency_skipped' end,
           skipped_at = pg_catalog.now(),
           remaining_tasks = null
      from tree
     where ss.run_id = _cascade_force_skip_steps.run_id
       and ss.step_slug = tree.step_slug
       and ss.status in ('created', 'started')
    returning ss.step_slug, ss.skip_reason, ss.skipped_at
  )
  select pg_catalog.array_agg(k.step_slug), pg_catalog.array_agg(k.skip_reason), pg_catalog.array_agg(k.skipped_at)
    into v_slugs, v_reasons, v_times
    from skipped k;

  if v_slugs is null then
    return 0;
  end if;

  for v_skipped in
    select x.slug, x.reason, x.at
      -- unnest of several arrays is FROM-clause syntax and cannot be schema-qualified.
      from unnest(v_slugs, v_reasons, v_times) as x(slug, reason, at)
      join pgflow.steps s on s.flow_slug = v_flow_slug and s.step_slug = x.slug
     order by s.step_index
  loop
    perform realtime.send(
      pg_catalog.jsonb_build_object(
        'event_type', 'step:skipped',
        'run_id', _cascade_force_skip_steps.run_id,
        'flow_slug', v_flow_slug,
        'step_slug', v_skipped.slug,
        'status', 'skipped',
        'skip_reason', v_skipped.reason,
        'skipped_at', v_skipped.at),
      'step:' || v_skipped.slug || ':skipped',
      'pgflow:run:' || _cascade_force_skip_steps.run_id,
      false);
  end loop;

  -- Their active tasks first, then the messages, one archive per queue.
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
    perform pgmq.archive(v_group.queue_name, v_group.ids);
  end loop;

  update pgflow.runs r
     set remaining_steps = r.remaining_steps - pg_catalog.cardinality(v_slugs)
   where r.run_id = _cascade_force_skip_steps.run_id;

  return pg_catalog.cardinality(v_slugs);
end
$$;

-- Decides the conditions of every created step whose dependencies are done:
-- an unmet 'fail' step fails the run (false); unmet 'skip' steps are skipped;
-- unmet 'skip-cascade' steps are skipped with their dependents. Repeats while
-- skips make new steps ready (at most 50 rounds).
create or replace function pgflow.cascade_resolve_conditions(run_id uuid)
returns boolean
language plpgsql
set search_path = ''
as $$
declare
  v_run pgflow.runs;
  v_round integer := 0;
  v_fail_slug text;
  v_skip_slugs text[];
  v_cascade_slugs text[];
  v_now timestamptz;
  v_skip record;
  v_slug text;
  v_group record;
begin
  select * into v_run from pgflow.runs r where r.run_id = cascade_resolve_conditions.run_id;
  if not found or v_run.status = 'failed' then
    return false;
  end if;
  if v_run.status = 'completed' then
    return true;
  end if;

  loop
    v_round := v_round + 1;
    if v_round > 50 then
      raise exception 'cascade_resolve_conditions: more than 50 rounds for run %', cascade_resolve_conditions.run_id;
    end if;

    -- Created steps whose dependencies are done and whose patterns say no.
    -- The condition input: the run input for a root step, else the outputs
    -- of the completed dependencies keyed by slug (skipped ones absent).
    select (pg_catalog.array_agg(c.step_slug order by c.step_index) filter (where c.when_unmet = 'fail'))[1],
           pg_catalog.array_agg(c.step_slug order by c.step_index) filter (where c.when_unmet = 'skip'),
           pg_catalog.array_agg(c.step_slug order by c.step_index) filter (where c.when_unmet = 'skip-cascade')
      into v_fail_slug, v_skip_slugs, v_cascade_slugs
      from (
        select s.step_slug, s.step_index, s.when_unmet, s.required_input_pattern, s.forbidden_input_pattern,
               case when s.deps_count = 0 then v_run.input
                    else coalesce((select pg_catalog.jsonb_object_agg(d.dep_slug, ds.output)
                                     from pgflow.deps d
                                     join pgflow.step_states ds
                                       on ds.run_id = ss.run_id and ds.step_slug = d.dep_slug and ds.status = 'completed'
                                    where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug), '{}'::jsonb)
               end as cond_input
          from pgflow.step_states ss
          join pgflow.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
         where ss.run_id = cascade_resolve_conditions.run_id
           and ss.status = 'created'
           and ss.remaining_deps = 0
           and (s.required_input_pattern is not null or s.forbidden_input_pattern is not null)
      ) c
     where not ((c.required_input_pattern is null or c.cond_input @> c.required_input_pattern)
                and (c.forbidden_input_pattern is null or not (c.cond_input @> c.forbidden_input_pattern)));

    if v_fail_slug is null and v_skip_slugs is null and v_cascade_slugs is null then
      return true;
    end if;

    -- 1. The first unmet 'fail' step fails the run.
    if v_fail_slug is not null then
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
            'flow_slug', v_run.flow_slug,
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

    -- 2. Unmet 'skip' steps: skipped; each dependent loses one dependency
    --    per skipped parent (a map whose only parent was skipped has no tasks).
    if v_skip_slugs is not null then
      for v_skip in
        with skipped as (
          update pgflow.step_states ss
             set status = 'skipped', skip_reason = 'condition_unmet', skipped_at = pg_catalog.now()
           where ss.run_id = cascade_resolve_conditions.run_id
             and ss.step_slug = any (v_skip_slugs)
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
            'flow_slug', v_run.flow_slug,
            'step_slug', v_skip.step_slug,
            'status', 'skipped',
            'skip_reason', 'condition_unmet',
            'skipped_at', v_skip.skipped_at),
          'step:' || v_skip.step_slug || ':skipped',
          'pgflow:run:' || cascade_resolve_conditions.run_id,
          false);
      end loop;

      update pgflow.step_states child
         set remaining_deps = child.remaining_deps - x.n,
             initial_tasks = case when cs.step_type = 'map' and cs.deps_count = x.n then 0
                                  else child.initial_tasks end
        from (select d.step_slug, pg_catalog.count(*)::integer as n
                from pgflow.deps d
               where d.flow_slug = v_run.flow_slug
                 and d.dep_slug = any (v_skip_slugs)
               group by d.step_slug) x,
             pgflow.steps cs
       where child.run_id = cascade_resolve_conditions.run_id
         and child.step_slug = x.step_slug
         and cs.flow_slug = v_run.flow_slug and cs.step_slug = x.step_slug;

      update pgflow.runs r
         set remaining_steps = r.remaining_steps - pg_catalog.cardinality(v_skip_slugs)
       where r.run_id = cascade_resolve_conditions.run_id;
    end if;

    -- 3. Unmet 'skip-cascade' steps, in step order, with their dependents.
    if v_cascade_slugs is not null then
      foreach v_slug in array v_cascade_slugs loop
        perform pgflow._cascade_force_skip_steps(cascade_resolve_conditions.run_id, v_slug, 'condition_unmet');
      end loop;
    end if;
  end loop;
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
  -- message goes, nothing else changes.
  if v_run.status = 'failed' or v_state.status is distinct from 'started' then
    perform pgflow._archive_task_message(complete_task.run_id, complete_task.step_slug, complete_task.task_index);
    return query select * from pgflow.step_tasks t
      where t.run_id = complete_task.run_id and t.step_slug = complete_task.step_slug
        and t.task_index = complete_task.task_index;
    return;
  end if;

  select * into v_step from pgflow.steps s
   where s.flow_slug = v_state.flow_slug and s.step_slug = complete_task.step_slug;

  -- A single step feeding a map whose task count is still unknown must
  -- produce an array.
  if v_step.step_type = 'single' and pg_catalog.jsonb_typeof(complete_task.output) is distinct from 'array' then
    select d.step_slug into v_map_child
      from pgflow.deps d
      join pgflow.steps cs on cs.flow_slug = d.flow_slug and cs.step_slug = d.step_slug and cs.step_type = 'map'
      join pgflow.step_states cst on cst.run_id = complete_task.run_id and cst.step_slug = d.step_slug
     where d.flow_slug = v_state.flow_slug
       and d.dep_slug = complete_task.step_slug
       and cst.initial_tasks is null
     order by cs.step_index
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
    -- in task_index order (one row version, not two).
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
                                          and t.step_slug = complete_task.step_slug), '[]'::jsonb)
                      else complete_task.output end
     where ss.run_id = complete_task.run_id and ss.step_slug = complete_task.step_slug
    returning * into v_state;

    if v_state.remaining_tasks = 0 then
      v_completed := v_state;

      -- Dependents lose one dependency; a dependent map learns its size.
      update pgflow.step_states child
         set remaining_deps = child.remaining_deps - 1,
             initial_tasks = case
               when cs.step_type <> 'map' then child.initial_tasks
               when v_step.step_type = 'map' then v_state.initial_tasks
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
  v_task pgflow.step_tasks;
  v_step pgflow.steps;
  v_flow pgflow.flows;
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

  select * into v_run from pgflow.runs r where r.run_id = fail_task.run_id for update;
  select * into v_state from pgflow.step_states ss
   where ss.run_id = fail_task.run_id and ss.step_slug = fail_task.step_slug for update;

  if v_run.status = 'failed' or v_state.status is distinct from 'started' then
    perform pgflow._archive_task_message(fail_task.run_id, fail_task.step_slug, fail_task.task_index);
    return query select * from pgflow.step_tasks t
      where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
        and t.task_index = fail_task.task_index;
    return;
  end if;

  select * into v_task from pgflow.step_tasks t
   where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
     and t.task_index = fail_task.task_index and t.status = 'started'
     for update;
  if not found then
    return query select * from pgflow.step_tasks t
      where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
        and t.task_index = fail_task.task_index;
    return;
  end if;

  select * into v_step from pgflow.steps s
   where s.flow_slug = v_state.flow_slug and s.step_slug = fail_task.step_slug;
  select * into v_flow from pgflow.flows f where f.flow_slug = v_state.flow_slug;
  v_max_attempts := coalesce(v_step.opt_max_attempts, v_flow.opt_max_attempts);
  v_base_delay := coalesce(v_step.opt_base_delay, v_flow.opt_base_delay);

  -- Attempts left: back to queued; the message reappears after the delay.
  if v_task.attempts_count < v_max_attempts then
    update pgflow.step_tasks t
       set status = 'queued', started_at = null, error_message = fail_task.error_message
     where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
       and t.task_index = fail_task.task_index;
    if v_task.message_id is not null then
      perform pgmq.set_vt(v_task.queue_name, v_task.message_id,
                          pgflow.calculate_retry_delay(v_base_delay, v_task.attempts_count));
    end if;
    return query select * from pgflow.step_tasks t
      where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
        and t.task_index = fail_task.task_index;
    return;
  end if;

  -- Exhausted.
  v_now := pg_catalog.now();
  update pgflow.step_tasks t
     set status = 'failed', failed_at = v_now, error_message = fail_task.error_message
   where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
     and t.task_index = fail_task.task_index;

  if v_step.when_exhausted = 'fail' then
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
             initial_tasks = case when cs.step_type = 'map' then 0 else child.initial_tasks end
        from pgflow.deps d, pgflow.steps cs
       where d.flow_slug = v_state.flow_slug and d.dep_slug = fail_task.step_slug
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

  perform pgflow._archive_task_message(fail_task.run_id, fail_task.step_slug, fail_task.task_index);
  return query select * from pgflow.step_tasks t
    where t.run_id = fail_task.run_id and t.step_slug = fail_task.step_slug
      and t.task_index = fail_task.task_index;
end
$$;

-- Recovers tasks whose worker vanished: started longer ago than the step's
-- (else the flow's) timeout + 30 s, on a started run and step. Under three
-- requeues they become queued with their message visible at once; the rest
-- are marked permanently stalled and their messages archived (per queue).
-- Returns how many were requeued.
create or replace function pgflow.requeue_stalled_tasks()
returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_requeued integer := 0;
  v_group record;
begin
  for v_group in
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
    )
    select x.queue_name, x.requeue, pg_catalog.count(*)::integer as n,
           pg_catalog.array_agg(x.message_id order by x.message_id) filter (where x.message_id is not null) as ids
      from touched x
     group by x.queue_name, x.requeue
     order by x.queue_name, x.requeue
  loop
    if v_group.requeue then
      v_requeued := v_requeued + v_group.n;
      if v_group.ids is not null then
        perform pgflow.set_vt_batch(v_group.queue_name, v_group.ids,
                                    pg_catalog.array_fill(0, array[pg_catalog.cardinality(v_group.ids)]));
      end if;
    elsif v_group.ids is not null then
      perform pgmq.archive(v_group.queue_name, v_group.ids);
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

  select * into v_flow from pgflow.flows f where f.flow_slug = create_flow.flow_slug;
  if not found then
    if exists (select 1 from pgmq.list_queues() q where pg_catalog.lower(q.queue_name::text) = v_queue) then
      raise exception 'cannot create flow %: pgmq already lists a queue named %', create_flow.flow_slug, v_queue
        using errcode = 'unique_violation',
              hint = 'Queues are pgflow''s own: drop the stray queue, or choose another slug.';
    end if;
    insert into pgflow.flows (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout)
    values (create_flow.flow_slug,
            coalesce(create_flow.max_attempts, 3),
            coalesce(create_flow.base_delay, 5),
            coalesce(create_flow.timeout, 60))
    returning * into v_flow;
  end if;

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
  v_mode text;
  v_step pgflow.steps;
  v_deps text[] := coalesce(add_step.deps_slugs, '{}');
begin
  perform pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(pg_catalog.lower(add_step.flow_slug)));

  select f.queue_mode into v_mode from pgflow.flows f where f.flow_slug = add_step.flow_slug;
  if v_mode = 'step' then
    raise exception 'flow % uses step queues: its steps come only from ensure_flow_compiled', add_step.flow_slug
      using errcode = 'feature_not_supported',
            hint = 'Compile step-mode flows at worker startup (ensure_flow_compiled with queue_mode ''step'').';
  end if;
  if add_step.step_type = 'map' and pg_catalog.cardinality(v_deps) > 1 then
    raise exception 'map step % can have at most one dependency, got %', add_step.step_slug, pg_catalog.cardinality(v_deps)
      using errcode = 'invalid_parameter_value';
  end if;

  insert into pgflow.steps as s (flow_slug, step_slug, step_type, step_index, deps_count,
                                 opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay,
                                 required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted,
                                 queue_name)
  select add_step.flow_slug, add_step.step_slug, add_step.step_type,
         coalesce((select pg_catalog.max(x.step_index) + 1 from pgflow.steps x where x.flow_slug = add_step.flow_slug), 0),
         pg_catalog.cardinality(v_deps),
         add_step.max_attempts, add_step.base_delay, add_step.timeout, add_step.start_delay,
         add_step.required_input_pattern, add_step.forbidden_input_pattern,
         add_step.when_unmet, add_step.when_exhausted,
         pg_catalog.lower(add_step.flow_slug)
  on conflict on constraint steps_pkey do nothing
  returning * into v_step;

  if v_step.step_slug is null then
    select * into v_step from pgflow.steps s
     where s.flow_slug = add_step.flow_slug and s.step_slug = add_step.step_slug;
  end if;

  insert into pgflow.deps (flow_slug, dep_slug, step_slug)
  select add_step.flow_slug, d.dep, add_step.step_slug
    from pg_catalog.unnest(v_deps) as d(dep)
  on conflict on constraint deps_pkey do nothing;

  return v_step;
end
$$;

-- Deletes a flow with all its data and queues: each distinct step queue,
-- plus lower(slug) in flow mode, dropped under the spelling pgmq lists.
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

  select f.queue_mode into v_mode from pgflow.flows f where f.flow_slug = p_flow_slug;
  if found then
    for v_queue in
      select s.queue_name from pgflow.steps s where s.flow_slug = p_flow_slug
      union
      select pg_catalog.lower(p_flow_slug) where v_mode = 'flow'
      order by 1
    loop
      -- Only queues pgmq lists (pgmq 1.5.1's drop_queue raises on others).
      if exists (select 1 from pgmq.list_queues() q where pg_catalog.lower(q.queue_name::text) = v_queue) then
        perform pgmq.drop_queue(pgflow._listed_queue_name(v_queue));
      end if;
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
  v_listed integer;
begin
  select s.flow_slug into v_other
    from pgflow.steps s
   where s.queue_name = p_queue_name and s.flow_slug <> p_flow_slug
   limit 1;
  if v_other is null then
    select f.flow_slug into v_other
      from pgflow.flows f
     where f.queue_mode = 'flow'
       and pg_catalog.lower(f.flow_slug) = p_queue_name
       and f.flow_slug <> p_flow_slug
     limit 1;
  end if;
  if v_other is not null then
    raise exception 'queue % of flow % is already the queue of flow %', p_queue_name, p_flow_slug, v_other
      using errcode = 'unique_violation';
  end if;

  select pg_catalog.count(*)::integer into v_listed
    from pgmq.list_queues() q
   where pg_catalog.lower(q.queue_name::text) = p_queue_name;
  if v_listed > 1 then
    raise exception 'pgmq lists more than one queue named % in some case', p_queue_name
      using errcode = 'ambiguous_alias';
  end if;

  if exists (select 1 from pgflow.steps s
              where s.flow_slug = p_flow_slug and s.queue_name = p_queue_name) then
    return false;
  end if;
  if v_listed = 1 then
    raise exception 'queue % exists in pgmq but no route of flow % owns it', p_queue_name, p_flow_slug
      using errcode = 'duplicate_object',
            hint = 'Queues are pgflow''s own: drop the stray queue, then compile again.';
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

-- Builds a flow from a FlowShape. Flow mode: create_flow, then add_step per
-- step. Step mode: every route is derived and checked before anything
-- changes, the missing queues are created, then the flow, its steps (each
-- with its own queue) and the dependencies are inserted.
create function pgflow._create_flow_from_shape(p_flow_slug text, p_shape jsonb, p_queue_mode text default 'flow')
returns void
language plpgsql
set search_path = ''
as $$
declare
  v_routes jsonb;
  v_route jsonb;
  v_step jsonb;
  v_index integer;
  v_opts jsonb := coalesce(p_shape -> 'options', '{}'::jsonb);
  v_step_opts jsonb;
  v_create text[] := '{}';
  v_queue text;
begin
  perform pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(pg_catalog.lower(p_flow_slug)));
  v_routes := pgflow._derive_queue_routes(p_flow_slug, p_shape, p_queue_mode);

  if p_queue_mode = 'flow' then
    perform pgflow.create_flow(p_flow_slug,
                               (v_opts ->> 'maxAttempts')::integer,
                               (v_opts ->> 'baseDelay')::integer,
                               (v_opts ->> 'timeout')::integer);
    for v_step in select e.value from pg_catalog.jsonb_array_elements(p_shape -> 'steps') e loop
      v_step_opts := coalesce(v_step -> 'options', '{}'::jsonb);
      perform pgflow.add_step(
        flow_slug => p_flow_slug,
        step_slug => v_step ->> 'slug',
        deps_slugs => coalesce(array(select pg_catalog.jsonb_array_elements_text(v_step -> 'dependencies')), '{}'),
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

  -- Step mode: check every route first.
  for v_route in select e.value from pg_catalog.jsonb_array_elements(v_routes) e loop
    if pgflow._assert_step_queue_available(p_flow_slug, v_route ->> 'queueName') then
      v_create := v_create || (v_route ->> 'queueName');
    end if;
  end loop;
  foreach v_queue in array v_create loop
    perform pgmq.create(v_queue);
  end loop;

  insert into pgflow.flows (flow_slug, opt_max_attempts, opt_base_delay, opt_timeout, queue_mode)
  values (p_flow_slug,
          coalesce((v_opts ->> 'maxAttempts')::integer, 3),
          coalesce((v_opts ->> 'baseDelay')::integer, 5),
          coalesce((v_opts ->> 'timeout')::integer, 60),
          'step');

  v_index := 0;
  for v_step in select e.value from pg_catalog.jsonb_array_elements(p_shape -> 'steps') e loop
    v_step_opts := coalesce(v_step -> 'options', '{}'::jsonb);
    if coalesce(v_step ->> 'stepType', 'single') = 'map'
       and pg_catalog.jsonb_array_length(coalesce(v_step -> 'dependencies', '[]'::jsonb)) > 1 then
      raise exception 'map step % can have at most one dependency', v_step ->> 'slug'
        using errcode = 'invalid_parameter_value';
    end if;
    insert into pgflow.steps (flow_slug, step_slug, step_type, step_index, deps_count,
                              opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay,
                              required_input_pattern, forbidden_input_pattern, when_unmet, when_exhausted,
                              queue_name)
    values (p_flow_slug, v_step ->> 'slug', coalesce(v_step ->> 'stepType', 'single'), v_index,
            pg_catalog.jsonb_array_length(coalesce(v_step -> 'dependencies', '[]'::jsonb)),
            (v_step_opts ->> 'maxAttempts')::integer, (v_step_opts ->> 'baseDelay')::integer,
            (v_step_opts ->> 'timeout')::integer, (v_step_opts ->> 'startDelay')::integer,
            case when (v_step -> 'requiredInputPattern' ->> 'defined')::boolean
                 then v_step -> 'requiredInputPattern' -> 'value' end,
            case when (v_step -> 'forbiddenInputPattern' ->> 'defined')::boolean
                 then v_step -> 'forbiddenInputPattern' -> 'value' end,
            coalesce(v_step ->> 'whenUnmet', 'skip'), coalesce(v_step ->> 'whenExhausted', 'fail'),
            v_routes -> v_index ->> 'queueName');
    v_index := v_index + 1;
  end loop;

  insert into pgflow.deps (flow_slug, dep_slug, step_slug)
  select p_flow_slug, dep.value, st.value ->> 'slug'
    from pg_catalog.jsonb_array_elements(p_shape -> 'steps') st,
         pg_catalog.jsonb_array_elements_text(coalesce(st.value -> 'dependencies', '[]'::jsonb)) dep;
end
$$;

-- The worker's startup call: compile a missing flow, verify an existing one
-- (shape, queue mode and the ordered step -> queue routes), recompile it on a
-- local database, or report the mismatch. A supplied route_map must equal the
-- derived routes entry for entry.
create function pgflow.ensure_flow_compiled(flow_slug text, shape jsonb, queue_mode text default 'flow',
                                            route_map jsonb default null)
returns jsonb
language plpgsql
set search_path = ''
as $$
declare
  v_routes jsonb;
  v_stored_mode text;
  v_stored_routes jsonb;
  v_shape_diffs text[];
  v_route_diffs text[] := '{}';
  v_route jsonb;
  v_i integer;
begin
  perform pg_catalog.pg_advisory_xact_lock(1, pg_catalog.hashtext(pg_catalog.lower(ensure_flow_compiled.flow_slug)));

  v_routes := pgflow._derive_queue_routes(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape,
                                          ensure_flow_compiled.queue_mode);
  if ensure_flow_compiled.route_map is not null then
    if pg_catalog.jsonb_typeof(ensure_flow_compiled.route_map) <> 'array'
       or pg_catalog.jsonb_array_length(ensure_flow_compiled.route_map) <> pg_catalog.jsonb_array_length(v_routes) then
      raise exception 'route map of flow % does not match its derived routes: expected %, got %',
        ensure_flow_compiled.flow_slug, v_routes, ensure_flow_compiled.route_map
        using errcode = 'invalid_parameter_value';
    end if;
    for v_i in 0 .. pg_catalog.jsonb_array_length(v_routes) - 1 loop
      if (ensure_flow_compiled.route_map -> v_i ->> 'stepSlug') is distinct from (v_routes -> v_i ->> 'stepSlug')
         or (ensure_flow_compiled.route_map -> v_i ->> 'queueName') is distinct from (v_routes -> v_i ->> 'queueName') then
        raise exception 'route map of flow % does not match its derived routes at entry %: expected %, got %',
          ensure_flow_compiled.flow_slug, v_i, v_routes -> v_i, ensure_flow_compiled.route_map -> v_i
          using errcode = 'invalid_parameter_value';
      end if;
    end loop;
  end if;

  select f.queue_mode into v_stored_mode from pgflow.flows f where f.flow_slug = ensure_flow_compiled.flow_slug;
  if not found then
    perform pgflow._create_flow_from_shape(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape,
                                           ensure_flow_compiled.queue_mode);
    return pg_catalog.jsonb_build_object('status', 'compiled', 'differences', '[]'::jsonb, 'mismatchKind', null);
  end if;

  v_shape_diffs := pgflow._compare_flow_shapes(ensure_flow_compiled.shape,
                                               pgflow._get_flow_shape(ensure_flow_compiled.flow_slug));

  if v_stored_mode is distinct from ensure_flow_compiled.queue_mode then
    v_route_diffs := v_route_diffs || pg_catalog.format('Queue mode differs: database has %s, local has %s',
                                                        v_stored_mode, ensure_flow_compiled.queue_mode);
  end if;
  select coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('stepSlug', s.step_slug, 'queueName', s.queue_name)
                                        order by s.step_index), '[]'::jsonb)
    into v_stored_routes
    from pgflow.steps s where s.flow_slug = ensure_flow_compiled.flow_slug;
  if v_stored_routes <> v_routes then
    v_route_diffs := v_route_diffs || pg_catalog.format('Queue routes differ: database has %s, local has %s',
                                                        v_stored_routes, v_routes);
  end if;

  if coalesce(pg_catalog.cardinality(v_shape_diffs), 0) = 0 and pg_catalog.cardinality(v_route_diffs) = 0 then
    if ensure_flow_compiled.queue_mode = 'step' then
      for v_route in select e.value from pg_catalog.jsonb_array_elements(v_routes) e loop
        perform pgflow._assert_step_queue_available(ensure_flow_compiled.flow_slug, v_route ->> 'queueName');
      end loop;
    end if;
    return pg_catalog.jsonb_build_object('status', 'verified', 'differences', '[]'::jsonb, 'mismatchKind', null);
  end if;

  v_shape_diffs := coalesce(v_shape_diffs, '{}') || v_route_diffs;
  if pgflow.is_local() then
    perform pgflow.delete_flow_and_data(ensure_flow_compiled.flow_slug);
    perform pgflow._create_flow_from_shape(ensure_flow_compiled.flow_slug, ensure_flow_compiled.shape,
                                           ensure_flow_compiled.queue_mode);
    return pg_catalog.jsonb_build_object('status', 'recompiled', 'differences', pg_catalog.to_jsonb(v_shape_diffs),
                                         'mismatchKind', null);
  end if;
  return pg_catalog.jsonb_build_object(
    'status', 'mismatch',
    'differences', pg_catalog.to_jsonb(v_shape_diffs),
    'mismatchKind', case when pg_catalog.cardinality(v_shape_diffs) = pg_catalog.cardinality(v_route_diffs)
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
set plan_cache_mode = force_custom_plan
set search_path = ''
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
  if v_mode = 'step' then
    if start_tasks.step_slug is null then
      raise exception 'flow % uses step queues: start_tasks needs the step_slug of queue %', start_tasks.flow_slug, start_tasks.queue_name
        using errcode = 'invalid_parameter_value';
    end if;
    if not exists (select 1 from pgflow.steps s
                    where s.flow_slug = start_tasks.flow_slug and s.step_slug = start_tasks.step_slug
                      and s.queue_name = start_tasks.queue_name) then
      raise exception 'flow % has no route from step % to queue %', start_tasks.flow_slug, start_tasks.step_slug, start_tasks.queue_name
        using errcode = 'invalid_parameter_value';
    end if;
  elsif start_tasks.step_slug is not null then
    raise exception 'flow % uses one flow queue: start_tasks takes no step_slug (got %)', start_tasks.flow_slug, start_tasks.step_slug
      using errcode = 'invalid_parameter_value';
  end if;

  -- One statement claims, takes a root step's input from the run row it
  -- joined, and hides the claimed messages. This function is planned
  -- afresh at every call (force_custom_plan), so the statements are kept
  -- small: few joins each, and the dependency lookups only planned (below)
  -- when a claimed step has dependencies.
  --
  -- The claim is guarded: the rows are found by their message through the
  -- unique (queue_name, message_id) index alone and locked, the conditions
  -- are checked on the locked (latest) rows, and only those still queued on
  -- a started run and step are updated, by primary key. Finding them by
  -- that index alone keeps the plan cheap whatever the statistics say
  -- (after a burst of new runs they are stale, and a plan chosen from them
  -- can scan every queued task).
  with locked as materialized (
    select k.run_id, k.step_slug, k.task_index, k.flow_slug, k.status
      from pgflow.step_tasks k
     where k.queue_name = start_tasks.queue_name
       and k.message_id = any (start_tasks.msg_ids)
       for update of k
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
  if v_out.hidden < pg_catalog.cardinality(v_out.ids) then
    raise exception 'start_tasks: % tasks claimed but only % messages of queue % found to hide',
      pg_catalog.cardinality(v_out.ids), v_out.hidden, start_tasks.queue_name
      using errcode = 'object_not_in_prerequisite_state';
  end if;

  -- unnest of several arrays is FROM-clause syntax and cannot be schema-qualified.
  if not v_out.has_deps then
    return query
    select start_tasks.flow_slug, o.run_id, o.step_slug, o.input, o.msg_id, o.task_index, o.flow_input
      from unnest(v_out.run_ids, v_out.step_slugs, v_out.inputs, v_out.ids, v_out.task_indexes, v_out.flow_inputs)
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
    from unnest(v_out.run_ids, v_out.step_slugs, v_out.inputs, v_out.ids, v_out.task_indexes, v_out.flow_inputs)
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
