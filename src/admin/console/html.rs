//! HTML text for the console: every value from the journal, an agent or a config is
//! escaped here, so a body holding `<script>` is shown as text and never run.

use std::fmt::Write;

/// Text safe in element content and in quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Shown, not obeyed: a bidi override could make "0005" read "5000".
            c if invisible(c) => {
                let _ = write!(out, "<span class=\"cp\">U+{:04X}</span>", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// Bidi controls and invisible characters, which change how the text around them reads.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}'
        | '\u{FEFF}' | '\u{061C}' | '\u{00AD}' | '\u{2028}' | '\u{2029}')
}

/// A path segment for a link (ids are `act_<ULID>`-like; anything else is escaped).
pub fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// The console's pages, in the order of the navigation.
pub const PAGES: [(&str, &str); 4] = [
    ("approvals", "Approvals"),
    ("reconcile", "Reconcile"),
    ("journal", "Journal"),
    ("agents", "Agents"),
];

/// A whole page: the navigation, the sign-out form and `main`. The CSRF token rides a
/// meta tag for the script and a hidden field in every form.
pub fn page(title: &str, active: &str, csrf: &str, main: &str) -> String {
    let mut nav = String::new();
    for (id, label) in PAGES {
        let current = if id == active {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(nav, "<a href=\"/ui/{id}\"{current}>{label}</a>");
    }
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"csrf\" content=\"{csrf}\"><title>postern · {title}</title>\
         <link rel=\"stylesheet\" href=\"/ui/static/console.css\">\
         <link rel=\"icon\" href=\"/ui/static/favicon.svg\"></head><body>\
         <header><span class=\"brand\">postern</span><nav>{nav}</nav>\
         <form method=\"post\" action=\"/ui/logout\" class=\"signout\">{hidden}\
         <button type=\"submit\">Sign out</button></form></header>\
         <main><h1>{title}</h1>{main}</main>\
         <script src=\"/ui/static/console.js\"></script></body></html>\n",
        csrf = esc(csrf),
        title = esc(title),
        hidden = csrf_field(csrf),
    )
}

/// The hidden field every state-changing form carries.
pub fn csrf_field(csrf: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(csrf)
    )
}

/// The sign-in page (no session yet, so no navigation).
pub fn sign_in(problem: Option<&str>) -> String {
    let problem = problem
        .map(|p| format!("<p class=\"problem\" role=\"alert\">{}</p>", esc(p)))
        .unwrap_or_default();
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>postern · Sign in</title>\
         <link rel=\"stylesheet\" href=\"/ui/static/console.css\"></head><body>\
         <main class=\"narrow\"><h1>postern console</h1>{problem}\
         <form method=\"post\" action=\"/ui/login\" id=\"sign-in\">\
         <label>Admin token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" autofocus></label>\
         <button type=\"submit\">Sign in</button></form>\
         <p class=\"hint\">The admin token postern was given: <code>[admin] token</code> in its config (often <code>env:POSTERN_ADMIN_TOKEN</code>).</p>\
         </main></body></html>\n"
    )
}

/// A message above a page's content: what an action did, or why it was refused.
pub fn notice(text: &str, problem: bool) -> String {
    let class = if problem { "problem" } else { "done" };
    format!("<p class=\"{class}\" role=\"status\">{}</p>", esc(text))
}

/// A table from a header row and rows of already-escaped cells.
pub fn table(id: &str, head: &[&str], rows: &[Vec<String>], empty: &str) -> String {
    if rows.is_empty() {
        return format!("<p class=\"empty\" id=\"{id}\">{}</p>", esc(empty));
    }
    let mut out = format!("<table id=\"{id}\"><thead><tr>");
    for h in head {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_is_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
        assert_eq!(seg("act_01H/../x y"), "act_01H%2F..%2Fx%20y");
        assert_eq!(
            esc("\"\u{202E}0005\u{202C}\""),
            "&quot;<span class=\"cp\">U+202E</span>0005<span class=\"cp\">U+202C</span>&quot;"
        );
    }
}
