import Crypto
import Foundation

/// Notifications that carry data (queue records, live messages, requests and replies) are sealed by the server, so
/// that no role outside the group can forge or replay one (FORMAT-POSTGRES.md, "Sealed notifications").
///
/// PostgreSQL checks no right on `LISTEN` or `pg_notify`: whoever knows a channel's name hears it and can send on it.
/// So a notification is taken on its own word only when it is sealed: the statement that sends it appends
/// `~PID:XID:` (the sending backend's process id and the transaction's id, from the server) and then the
/// HMAC-SHA256 of everything before it, in Base64, under the group's key, which the server reads from the group's
/// row in the same statement. The key never travels in a statement (so never in a server log); only roles granted
/// the group read it (row-level security), and it changes when a role is revoked.
///
/// A receiver takes a sealed notification when its HMAC is right under the key it read when it started listening,
/// when the PID in it is the backend that sent it (the server tells each listener, and a role cannot send as another
/// backend), and when its transaction is one that was not over when this connection started listening (nor already
/// seen from that backend). Anything else is a hint at most: a queue's observers read the table again, and a live
/// message is dropped.
struct NotificationSeal: Sendable {
    /// `K ⊕ ipad` and `K ⊕ opad`, 64 bytes each, as `wormhole.groups` keeps them.
    let inner: [UInt8]
    let outer: [UInt8]

    /// The seal of a group's key pads; nil when they are not 64 bytes each (a row written by hand).
    init?(inner: [UInt8], outer: [UInt8]) {
        guard inner.count == 64, outer.count == 64 else { return nil }
        self.inner = inner
        self.outer = outer
    }

    /// What a sealed notification says of where it came from.
    struct Origin: Sendable, Equatable {
        var backendPID: Int32
        var transaction: UInt64
    }

    /// The body of a sealed `notification` and where it came from, when its HMAC is right; nil otherwise.
    func open(_ notification: String) -> (body: Substring, origin: Origin, code: Substring)? {
        let bytes = notification.utf8
        // `BODY~PID:XID:MAC`: the trailer holds no `~`, so the last one starts it.
        guard let tilde = bytes.lastIndex(of: UInt8(ascii: "~")) else { return nil }
        let trailer = Substring(notification[bytes.index(after: tilde)...])
        let fields = trailer.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
        guard fields.count == 3, fields[0].utf8.count <= 10, fields[1].utf8.count <= 20,
            let pid = Int32(fields[0]), pid > 0, let xid = UInt64(fields[1]), fields[2].utf8.count == 44
        else { return nil }
        // Compared as the text the server wrote, not as decoded bytes: Base64 leaves the last character's low bits
        // free, and a code with other spellings would let one notification pass for another.
        let signed = notification[..<fields[2].startIndex]
        guard Self.constantTimeEqual(code(of: signed).base64EncodedString().utf8, fields[2].utf8) else { return nil }
        return (Substring(notification[..<tilde]), Origin(backendPID: pid, transaction: xid), fields[2])
    }

    /// HMAC-SHA256 of `message`'s UTF-8 under the key, from its pads: `H(outer ‖ H(inner ‖ message))`.
    func code(of message: Substring) -> Data {
        var first = SHA256()
        first.update(data: inner)
        var text = message
        text.withUTF8 { first.update(bufferPointer: UnsafeRawBufferPointer($0)) }
        var second = SHA256()
        second.update(data: outer)
        first.finalize().withUnsafeBytes { second.update(bufferPointer: $0) }
        return Data(second.finalize())
    }

    /// `notification` sealed as the server seals it, for the tests.
    func seal(_ notification: String, origin: Origin) -> String {
        let signed = notification + "~\(origin.backendPID):\(origin.transaction):"
        return signed + code(of: signed[...]).base64EncodedString()
    }

    private static func constantTimeEqual(_ one: String.UTF8View, _ other: Substring.UTF8View) -> Bool {
        guard one.count == other.count else { return false }
        var difference: UInt8 = 0
        for (a, b) in zip(one, other) { difference |= a ^ b }
        return difference == 0
    }
}

/// Which sealed notifications a listening connection takes: those of transactions that were not over when it
/// started listening, each once.
///
/// Every notification a connection hears comes from a transaction that commits after its `LISTEN`: so one that was in
/// progress at a snapshot taken before the `LISTEN` (in its list of transactions in progress), or began after it (at
/// or past its `xmax`). A replay of an older notification fails that test. One made since, replayed by a backend
/// that has its PID (the original one gone, the PID used again), names a transaction at or before the last one seen
/// from that PID: refused too, but for an exact copy of the last one, which is refused by its HMAC. A PID's
/// notifications arrive in the order of their commits, so its transactions only grow.
struct ReplayGuard: Sendable {
    /// `xmax` of the snapshot taken before `LISTEN`.
    let horizon: UInt64
    /// The transactions in progress at that snapshot.
    let inProgress: Set<UInt64>
    /// The last transaction taken from each backend, and the codes of the notifications taken from it.
    private var last: [Int32: (transaction: UInt64, codes: Set<String>)] = [:]
    /// More backends than this and the one seen longest ago goes: the horizon still refuses everything before `LISTEN`.
    static let backendLimit = 4_096

    /// The guard of a snapshot, as `pg_current_snapshot()::text` writes it (`xmin:xmax:xip,xip,…`); nil when
    /// it does not read as one.
    init?(snapshot: String) {
        let parts = snapshot.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 3, UInt64(parts[0]) != nil, let xmax = UInt64(parts[1]) else { return nil }
        var inProgress = Set<UInt64>()
        for item in parts[2].isEmpty ? [] : parts[2].split(separator: ",", omittingEmptySubsequences: false) {
            guard let xid = UInt64(item) else { return nil }
            inProgress.insert(xid)
        }
        horizon = xmax
        self.inProgress = inProgress
    }

    /// Whether a notification sealed with `origin` and `code`, sent by the backend `sender` (as the server says), is
    /// taken; if it is, it is remembered.
    mutating func admit(_ origin: NotificationSeal.Origin, code: Substring, sentBy sender: Int32) -> Bool {
        guard origin.backendPID == sender else { return false }
        guard origin.transaction >= horizon || inProgress.contains(origin.transaction) else { return false }
        if let seen = last[sender] {
            if origin.transaction < seen.transaction { return false }
            if origin.transaction == seen.transaction {
                // One transaction may notify more than once (a caller's own transaction block): each once.
                guard !seen.codes.contains(String(code)) else { return false }
                last[sender]?.codes.insert(String(code))
                return true
            }
        }
        if last[sender] == nil, last.count >= Self.backendLimit,
            let oldest = last.min(by: { $0.value.transaction < $1.value.transaction })?.key
        {
            last.removeValue(forKey: oldest)
        }
        last[sender] = (origin.transaction, [String(code)])
        return true
    }
}

extension Schema {
    /// Version 6: sealed notifications (``NotificationSeal``), and statements that notify on the group's channel as
    /// its row names it now, so that a rotation (``PostgresAdministration/revoke(group:from:)``) moves every sender at
    /// once. The functions of version 2 stay for processes still running an older build; this build calls the new ones.
    static let sealedNotificationsMigration: [String] = [
        "ALTER TABLE wormhole.groups ADD COLUMN key_inner bytea, ADD COLUMN key_outer bytea",
        // A group's key: 32 bytes, 244 of them random (two version 4 UUIDs: PostgreSQL's core has no other source of
        // random bytes without pgcrypto), kept as HMAC's two pads so that SQL needs no XOR of strings. Made for each
        // new row, and for a row whose key is set to null (a rotation).
        """
        CREATE FUNCTION wormhole.fill_group_key() RETURNS trigger
        LANGUAGE plpgsql SECURITY INVOKER AS $$
        DECLARE
            v_key bytea;
            v_inner bytea;
            v_outer bytea;
        BEGIN
            IF NEW.key_inner IS NULL OR NEW.key_outer IS NULL THEN
                v_key := pg_catalog.decode(pg_catalog.replace(pg_catalog.gen_random_uuid()::text
                    || pg_catalog.gen_random_uuid()::text, '-', '') || pg_catalog.repeat('00', 32), 'hex');
                v_inner := v_key;
                v_outer := v_key;
                FOR i IN 0..63 LOOP
                    v_inner := pg_catalog.set_byte(v_inner, i, pg_catalog.get_byte(v_key, i) # 54);
                    v_outer := pg_catalog.set_byte(v_outer, i, pg_catalog.get_byte(v_key, i) # 92);
                END LOOP;
                NEW.key_inner := v_inner;
                NEW.key_outer := v_outer;
            END IF;
            RETURN NEW;
        END
        $$
        """,
        """
        CREATE TRIGGER group_key BEFORE INSERT OR UPDATE ON wormhole.groups
        FOR EACH ROW EXECUTE FUNCTION wormhole.fill_group_key()
        """,
        "UPDATE wormhole.groups SET key_inner = NULL",
        "ALTER TABLE wormhole.groups ALTER COLUMN key_inner SET NOT NULL, ALTER COLUMN key_outer SET NOT NULL",
        // A hint (`n…`, `r`): on the channel the group's row names now, with `p_suffix` (a live or reply channel's).
        """
        CREATE FUNCTION wormhole.notify(p_grp text, p_suffix text, p_text text) RETURNS void
        LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
        DECLARE
            v_channel text;
        BEGIN
            SELECT g.channel INTO v_channel FROM wormhole.groups g WHERE g.grp = p_grp;
            IF v_channel IS NULL THEN
                RAISE EXCEPTION 'the wormhole group % is not granted to this role', p_grp USING ERRCODE = '42501';
            END IF;
            PERFORM pg_catalog.pg_notify(v_channel || p_suffix, p_text);
        END
        $$
        """,
        // A notification that carries data, sealed: `~PID:XID:` and the HMAC-SHA256 of all of it under the group's key,
        // in Base64.
        """
        CREATE FUNCTION wormhole.notify_sealed(p_grp text, p_suffix text, p_text text) RETURNS void
        LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
        DECLARE
            v_channel text;
            v_inner bytea;
            v_outer bytea;
            v_signed text;
        BEGIN
            SELECT g.channel, g.key_inner, g.key_outer INTO v_channel, v_inner, v_outer
            FROM wormhole.groups g WHERE g.grp = p_grp;
            IF v_channel IS NULL THEN
                RAISE EXCEPTION 'the wormhole group % is not granted to this role', p_grp USING ERRCODE = '42501';
            END IF;
            v_signed := p_text || '~' || pg_catalog.pg_backend_pid() || ':' || pg_catalog.pg_current_xact_id() || ':';
            PERFORM pg_catalog.pg_notify(v_channel || p_suffix, v_signed || pg_catalog.encode(pg_catalog.sha256(
                v_outer || pg_catalog.sha256(v_inner || pg_catalog.convert_to(v_signed, 'UTF8'))), 'base64'));
        END
        $$
        """,
        // As `wormhole.live_send`, sealed, on the live channel `p_suffix` of the group's channel. The seal is made
        // here, as `wormhole.notify_sealed` makes it, rather than by calling it: a second function call per live
        // message cost about a tenth of its round trip.
        """
        CREATE FUNCTION wormhole.live_send_sealed(p_grp text, p_identifier text, p_suffix text, p_notification text)
        RETURNS bigint LANGUAGE plpgsql SECURITY INVOKER AS $$
        DECLARE
            v_count bigint;
            v_channel text;
            v_inner bytea;
            v_outer bytea;
            v_signed text;
        BEGIN
            SELECT count(*) INTO v_count FROM wormhole.live_endpoints e
            WHERE e.grp = p_grp AND e.identifier = p_identifier AND e.kind = 'listen'
                AND e.alive_key IS NOT NULL AND NOT pg_catalog.pg_try_advisory_xact_lock_shared(e.alive_key);
            IF v_count > 0 THEN
                SELECT g.channel, g.key_inner, g.key_outer INTO v_channel, v_inner, v_outer
                FROM wormhole.groups g WHERE g.grp = p_grp;
                v_signed := p_notification || '~' || pg_catalog.pg_backend_pid() || ':'
                    || pg_catalog.pg_current_xact_id() || ':';
                PERFORM pg_catalog.pg_notify(v_channel || p_suffix, v_signed || pg_catalog.encode(pg_catalog.sha256(
                    v_outer || pg_catalog.sha256(v_inner || pg_catalog.convert_to(v_signed, 'UTF8'))), 'base64'));
            END IF;
            RETURN v_count;
        END
        $$
        """,
        // As `wormhole.queue_append`, notifying through `wormhole.notify` (a hint) or, with the records carried,
        // `wormhole.notify_sealed`; `p_suffix` is the channel's suffix (empty: the group's channel).
        """
        CREATE FUNCTION wormhole.queue_append_sealed(
            p_grp text, p_queue text, p_sender text, p_time_ns bigint, p_payloads bytea[], p_suffix text,
            p_notification text, p_carried text
        ) RETURNS bigint LANGUAGE plpgsql SECURITY INVOKER AS $$
        DECLARE
            v_count bigint := pg_catalog.cardinality(p_payloads);
            v_first bigint;
        BEGIN
            UPDATE wormhole.queues q SET next_offset = q.next_offset + v_count
            WHERE q.grp = p_grp AND q.queue = p_queue
            RETURNING q.next_offset - v_count INTO v_first;
            IF v_first IS NULL THEN
                INSERT INTO wormhole.queues AS q (grp, queue, next_offset) VALUES (p_grp, p_queue, v_count)
                ON CONFLICT (grp, queue) DO UPDATE SET next_offset = q.next_offset + EXCLUDED.next_offset
                RETURNING q.next_offset - v_count INTO v_first;
            END IF;
            INSERT INTO wormhole.queue_records (grp, queue, "offset", sender, time_ns, payload)
            SELECT p_grp, p_queue, v_first + p.ordinal - 1, p_sender, p_time_ns, p.payload
            FROM pg_catalog.unnest(p_payloads) WITH ORDINALITY AS p(payload, ordinal);
            IF p_carried IS NULL THEN
                PERFORM wormhole.notify(p_grp, p_suffix, p_notification);
            ELSE
                PERFORM wormhole.notify_sealed(p_grp, p_suffix, 'Q' || v_first || ':' || p_carried);
            END IF;
            RETURN v_first;
        END
        $$
        """,
    ]
}
