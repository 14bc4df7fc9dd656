//! The jail's DNS stub (`127.0.0.1:53`, UDP): every A query is answered with 127.0.0.1,
//! where the transparent listeners wait; every other type gets an empty NOERROR answer
//! (so clients fall back to A instead of failing on AAAA). Nothing is forwarded.

const HEADER: usize = 12;
const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;
const TTL: u32 = 5;

const RCODE_FORMERR: u8 = 1;
const RCODE_NOTIMP: u8 = 4;

/// The reply to one query datagram; `None` for something too short to answer.
pub fn answer(query: &[u8]) -> Option<Vec<u8>> {
    let head = query.get(..HEADER)?;
    let (id, flags) = (&head[0..2], head[2]);
    if flags & 0x80 != 0 {
        return None; // a response, not a query
    }
    let opcode = (flags >> 3) & 0x0f;
    let rd = flags & 0x01;
    let qdcount = u16::from_be_bytes([head[4], head[5]]);
    let reply = |rcode: u8, question: &[u8], answers: u16| {
        let mut r = Vec::with_capacity(HEADER + question.len() + 16);
        r.extend_from_slice(id);
        r.push(0x80 | (opcode << 3) | 0x04 | rd); // QR, opcode, AA, RD
        r.push(0x80 | rcode); // RA, rcode
        r.extend_from_slice(&u16::from(!question.is_empty()).to_be_bytes());
        r.extend_from_slice(&answers.to_be_bytes());
        r.extend_from_slice(&[0, 0, 0, 0]);
        r.extend_from_slice(question);
        r
    };
    if opcode != 0 {
        return Some(reply(RCODE_NOTIMP, &[], 0));
    }
    if qdcount != 1 {
        return Some(reply(RCODE_FORMERR, &[], 0));
    }
    let Some((question, qtype, qclass)) = question(query) else {
        return Some(reply(RCODE_FORMERR, &[], 0));
    };
    if qtype != TYPE_A || qclass != CLASS_IN {
        return Some(reply(0, question, 0));
    }
    let mut r = reply(0, question, 1);
    r.extend_from_slice(&[0xc0, HEADER as u8]); // the name, as a pointer to the question
    r.extend_from_slice(&TYPE_A.to_be_bytes());
    r.extend_from_slice(&CLASS_IN.to_be_bytes());
    r.extend_from_slice(&TTL.to_be_bytes());
    r.extend_from_slice(&4u16.to_be_bytes());
    r.extend_from_slice(&[127, 0, 0, 1]);
    Some(r)
}

/// The first question's bytes (name, type, class), its type and class.
fn question(query: &[u8]) -> Option<(&[u8], u16, u16)> {
    let mut at = HEADER;
    loop {
        let len = usize::from(*query.get(at)?);
        if len == 0 {
            at += 1;
            break;
        }
        if len & 0xc0 != 0 {
            return None; // compression in a question: not from a real stub resolver
        }
        at += 1 + len;
    }
    let tail = query.get(at..at + 4)?;
    let qtype = u16::from_be_bytes([tail[0], tail[1]]);
    let qclass = u16::from_be_bytes([tail[2], tail[3]]);
    Some((query.get(HEADER..at + 4)?, qtype, qclass))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
        let mut q = id.to_be_bytes().to_vec();
        q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1]); // RD, 1 question, 1 additional
        for label in name.split('.') {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&CLASS_IN.to_be_bytes());
        // an EDNS OPT record, which the reply leaves out
        q.extend_from_slice(&[0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0]);
        q
    }

    #[test]
    fn an_a_query_gets_loopback_and_aaaa_gets_an_empty_noerror() {
        let q = query(0xbeef, "api.example.com", TYPE_A);
        let r = answer(&q).unwrap();
        assert_eq!(&r[0..2], &[0xbe, 0xef]);
        assert_eq!(r[2] & 0x80, 0x80, "a response");
        assert_eq!(r[3] & 0x0f, 0, "NOERROR");
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 1, "one answer");
        assert_eq!(&r[r.len() - 4..], &[127, 0, 0, 1]);
        let name_end = HEADER + "api.example.com".len() + 2 + 4;
        assert_eq!(
            &r[HEADER..name_end],
            &q[HEADER..name_end],
            "question echoed"
        );

        let r = answer(&query(7, "api.example.com", 28)).unwrap();
        assert_eq!(r[3] & 0x0f, 0);
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 0, "no AAAA answer");
    }

    #[test]
    fn garbage_is_refused_or_dropped_never_answered_with_an_address() {
        assert_eq!(answer(&[0; 5]), None);
        let mut q = query(1, "a.b", TYPE_A);
        q[2] |= 0x80;
        assert_eq!(answer(&q), None, "responses are not answered");
        let mut q = query(1, "a.b", TYPE_A);
        q[12] = 0xc0;
        let r = answer(&q).unwrap();
        assert_eq!(r[3] & 0x0f, RCODE_FORMERR);
        let mut q = query(1, "a.b", TYPE_A);
        q[2] = 0x10; // opcode 2 (status)
        assert_eq!(answer(&q).unwrap()[3] & 0x0f, RCODE_NOTIMP);
        let truncated = &query(1, "abc.def", TYPE_A)[..16];
        assert_eq!(answer(truncated).unwrap()[3] & 0x0f, RCODE_FORMERR);
    }
}
