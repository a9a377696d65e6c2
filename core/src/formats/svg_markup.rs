//! The pieces every SVG picture of the project is written with: text escaped for XML (in
//! elements and attribute values alike), the document's opening tag, lines through points and
//! legend entries. The timeline ([`super::svg`]), the frontier (`tune --frontier --svg`) and the
//! trainer's loss curve write their pictures with them, so they escape text one way.

/// `text` with XML's special characters escaped (`&`, `<`, `>`, and both quotes, so the text is
/// safe inside an attribute value too).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// The opening `<svg>` tag of a `width` x `height` picture (a view box of the same size) whose
/// text is `font_size` pixels of `font` (a CSS font family list), with a white background.
pub fn open_document(width: f64, height: f64, font: &str, font_size: f64) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"{}\" font-size=\"{font_size}\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        escape(font)
    )
}

/// An unfilled line through `points` (`x,y` each), drawn with the stroke attributes `stroke`.
pub fn polyline(points: &[String], stroke: &str) -> String {
    format!(
        "<polyline points=\"{}\" fill=\"none\" {stroke}/>\n",
        points.join(" ")
    )
}

/// A circle of radius `r` at (`cx`, `cy`) painted by the attributes `paint` (e.g.
/// `fill="red"`), with `title` as its tooltip.
pub fn titled_circle(title: &str, cx: f64, cy: f64, r: f64, paint: &str) -> String {
    format!(
        "<g><title>{}</title><circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"{r}\" {paint}/></g>\n",
        escape(title)
    )
}

/// A legend entry at (`x`, `y`): a short bar of `colour`, then `name`.
pub fn legend_entry(x: f64, y: f64, colour: &str, name: &str) -> String {
    format!(
        "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"12\" height=\"4\" fill=\"{}\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
        y - 4.0,
        escape(colour),
        x + 18.0,
        y + 1.0,
        escape(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_elements_and_attributes() {
        assert_eq!(
            escape(r#"a<b & "c" 'd'>"#),
            "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;"
        );
        assert_eq!(escape("plain"), "plain");
    }

    #[test]
    fn pieces_are_well_formed() {
        let doc = open_document(100.0, 50.0, "sans-serif", 12.0);
        assert!(doc.starts_with("<svg xmlns=") && doc.contains("viewBox=\"0 0 100 50\""));
        let line = polyline(&["1,2".into(), "3,4".into()], "stroke=\"red\"");
        assert_eq!(
            line,
            "<polyline points=\"1,2 3,4\" fill=\"none\" stroke=\"red\"/>\n"
        );
        let dot = titled_circle("x & y", 1.0, 2.0, 3.0, "fill=\"red\"");
        assert_eq!(
            dot,
            "<g><title>x &amp; y</title><circle cx=\"1.0\" cy=\"2.0\" r=\"3\" fill=\"red\"/></g>\n"
        );
        let entry = legend_entry(10.0, 20.0, "#000", "a<b");
        assert!(entry.contains(">a&lt;b</text>"), "{entry}");
    }
}
