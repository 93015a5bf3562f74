//! A table as text: a title, a header, rows of cells and notes, written as Markdown (for the
//! terminal and `report.md`) or as HTML (`report.html`).

/// A rendered table.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TextTable {
    /// Its heading ("Table 1. ...").
    pub title: String,
    /// Column headings.
    pub header: Vec<String>,
    /// Rows of cells, each as long as the header.
    pub rows: Vec<Vec<String>>,
    /// Sentences under the table: what the cells compute, what was not run.
    pub notes: Vec<String>,
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

pub(crate) fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl TextTable {
    /// Markdown: `### title`, the table (or "(no rows)"), then the notes as a list.
    pub fn to_markdown(&self) -> String {
        let mut out = format!("### {}\n\n", self.title);
        if self.rows.is_empty() {
            out.push_str("(no rows)\n");
        } else {
            let line = |cells: &[String]| {
                format!(
                    "| {} |\n",
                    cells
                        .iter()
                        .map(|c| md_cell(c))
                        .collect::<Vec<_>>()
                        .join(" | ")
                )
            };
            out.push_str(&line(&self.header));
            out.push_str(&format!("|{}\n", "---|".repeat(self.header.len())));
            for r in &self.rows {
                out.push_str(&line(r));
            }
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for n in &self.notes {
                out.push_str(&format!("- {}\n", md_cell(n)));
            }
        }
        out
    }

    /// HTML: an `<h3>`, a `<table>` and the notes as a `<ul>`.
    pub fn to_html(&self) -> String {
        let mut out = format!("<h3>{}</h3>\n", html_escape(&self.title));
        if self.rows.is_empty() {
            out.push_str("<p>(no rows)</p>\n");
        } else {
            out.push_str("<table>\n<thead><tr>");
            for h in &self.header {
                out.push_str(&format!("<th>{}</th>", html_escape(h)));
            }
            out.push_str("</tr></thead>\n<tbody>\n");
            for r in &self.rows {
                out.push_str("<tr>");
                for c in r {
                    out.push_str(&format!("<td>{}</td>", html_escape(c)));
                }
                out.push_str("</tr>\n");
            }
            out.push_str("</tbody>\n</table>\n");
        }
        if !self.notes.is_empty() {
            out.push_str("<ul class=\"notes\">\n");
            for n in &self.notes {
                out.push_str(&format!("<li>{}</li>\n", html_escape(n)));
            }
            out.push_str("</ul>\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_and_html_escape_their_cells() {
        let t = TextTable {
            title: "T <1>".into(),
            header: vec!["a".into(), "b".into()],
            rows: vec![vec!["x|y".into(), "<z>".into()]],
            notes: vec!["n".into()],
        };
        assert_eq!(
            t.to_markdown(),
            "### T <1>\n\n| a | b |\n|---|---|\n| x\\|y | <z> |\n\n- n\n"
        );
        let html = t.to_html();
        assert!(html.contains("<h3>T &lt;1&gt;</h3>"));
        assert!(html.contains("<td>&lt;z&gt;</td>"));
    }
}
