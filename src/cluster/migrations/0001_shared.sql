-- postern's shared state for a fleet (SPEC §7): only what several nodes must agree on.
-- Each node keeps its own journal; nothing here is a secret, a body the agent sent, or an event.

-- Each node; its last check of its own chain against its anchors (`audit verify --cluster`).
CREATE TABLE postern_nodes (
    node text PRIMARY KEY,
    started_ms bigint NOT NULL,
    seen_ms bigint NOT NULL,
    checked_ms bigint,
    check_ok boolean,
    check_detail text
);

-- The idempotency-key index (§3.4): slot = scope NUL agent NUL key.
CREATE TABLE postern_keys (
    slot bytea PRIMARY KEY,
    invocation_id text NOT NULL,
    fingerprint text NOT NULL,
    expires_at_ms bigint NOT NULL
);

-- The twin index (§3.7): slot = agent NUL route NUL fingerprint.
CREATE TABLE postern_twins (
    slot bytea PRIMARY KEY,
    invocation_id text NOT NULL,
    expires_at_ms bigint NOT NULL
);

-- The invocation directory: which node owns an invocation, and the state (and result) it
-- published once settled. A row without a state is claimed and in progress on its node.
-- The lease: `generation` is the current one, held by `node` since `lease_started_ms`;
-- `dispatched` once its worker crossed the dispatch boundary (then nobody supersedes it).
-- A state published for an older generation never overwrites a newer one.
CREATE TABLE postern_invocations (
    invocation_id text PRIMARY KEY,
    node text NOT NULL,
    claimed_ms bigint NOT NULL,
    generation integer NOT NULL DEFAULT 1,
    lease_started_ms bigint NOT NULL,
    dispatched boolean NOT NULL DEFAULT false,
    pub_generation integer NOT NULL DEFAULT 0,
    version bigint NOT NULL DEFAULT 0,
    state jsonb,
    result jsonb,
    expires_at_ms bigint
);
CREATE INDEX postern_invocations_unpublished ON postern_invocations (node) WHERE state IS NULL;

-- Minted tokens (§3.8) a fleet shares: one node at a time asks the token endpoint (the
-- lock), and the token and a rotated refresh token are kept here sealed under the fleet's
-- key (derived from the vault passphrase every node is given): never in the clear.
CREATE TABLE postern_minted (
    slot text PRIMARY KEY,
    lock_node text,
    lock_until_ms bigint,
    token_sealed text,
    token_until_ms bigint,
    refresh_sealed text,
    updated_ms bigint
);

-- Each node's chain head, written periodically (`postern audit verify --cluster`).
CREATE TABLE postern_anchors (
    node text NOT NULL,
    seq bigint NOT NULL,
    hash text NOT NULL,
    at_ms bigint NOT NULL,
    PRIMARY KEY (node, seq)
);

-- One atomic claim: a key and a twin slot for an invocation, both or neither, with its
-- directory row. Returns (lost, holder): lost is NULL when the claim won, else 'key' or
-- 'twin' with the invocation that holds the slot.
CREATE FUNCTION postern_claim(
    p_id text, p_node text, p_now bigint,
    k_slot bytea, k_id text, k_fp text, k_exp bigint,
    t_slot bytea, t_id text, t_exp bigint, t_saw text
) RETURNS TABLE (lost text, holder text) LANGUAGE plpgsql AS $$
DECLARE
    got text;
    held text;
BEGIN
    -- A lost claim raises, which undoes everything this block wrote.
    BEGIN
        IF k_slot IS NOT NULL THEN
            INSERT INTO postern_keys AS k (slot, invocation_id, fingerprint, expires_at_ms)
            VALUES (k_slot, k_id, k_fp, k_exp)
            ON CONFLICT (slot) DO UPDATE
                SET invocation_id = EXCLUDED.invocation_id,
                    fingerprint = EXCLUDED.fingerprint,
                    expires_at_ms = EXCLUDED.expires_at_ms
                WHERE k.invocation_id = EXCLUDED.invocation_id OR k.expires_at_ms <= p_now
            RETURNING k.invocation_id INTO got;
            IF got IS NULL THEN
                SELECT k.invocation_id INTO held FROM postern_keys k WHERE k.slot = k_slot;
                RAISE EXCEPTION USING ERRCODE = 'PT002', MESSAGE = COALESCE(held, '');
            END IF;
        END IF;
        IF t_slot IS NOT NULL THEN
            got := NULL;
            INSERT INTO postern_twins AS t (slot, invocation_id, expires_at_ms)
            VALUES (t_slot, t_id, t_exp)
            ON CONFLICT (slot) DO UPDATE
                SET invocation_id = EXCLUDED.invocation_id,
                    expires_at_ms = EXCLUDED.expires_at_ms
                WHERE t.invocation_id = EXCLUDED.invocation_id
                   OR t.invocation_id = t_saw
                   OR t.expires_at_ms <= p_now
            RETURNING t.invocation_id INTO got;
            IF got IS NULL THEN
                SELECT t.invocation_id INTO held FROM postern_twins t WHERE t.slot = t_slot;
                RAISE EXCEPTION USING ERRCODE = 'PT001', MESSAGE = COALESCE(held, '');
            END IF;
        END IF;
        INSERT INTO postern_invocations (invocation_id, node, claimed_ms, lease_started_ms)
        VALUES (p_id, p_node, p_now, p_now)
        ON CONFLICT (invocation_id) DO NOTHING;
    EXCEPTION
        WHEN SQLSTATE 'PT002' THEN
            RETURN QUERY SELECT 'key'::text, SQLERRM;
            RETURN;
        WHEN SQLSTATE 'PT001' THEN
            RETURN QUERY SELECT 'twin'::text, SQLERRM;
            RETURN;
    END;
    RETURN QUERY SELECT NULL::text, NULL::text;
END;
$$;
